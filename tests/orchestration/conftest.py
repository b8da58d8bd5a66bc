"""A scratch working directory with a tiny grid, for running the real workflow on the sim backend."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tiny_config(study: dict) -> dict:
    """One short condition, two repetitions, both engines, the defaults arm only."""
    cfg = copy.deepcopy(study)
    cfg["repetitions"] = 2
    cfg["conditions"] = [
        {"sweep": "rate", "rate": 0.28, "sharing": 0.9, "prompt_tokens": 1024, "duration_s": 40}
    ]
    cfg["arms"] = {"defaults": copy.deepcopy(study["arms"]["defaults"])}
    cfg["dispatch"]["warmup_requests"] = 2
    cfg["campaign"]["faults"] = []
    return cfg


class Workdir:
    def __init__(self, path: Path, config: dict) -> None:
        self.path = path
        self.config = config
        (path / "config").mkdir(parents=True, exist_ok=True)
        self.write_config()

    def write_config(self) -> None:
        (self.path / "config" / "config.yaml").write_text(
            yaml.safe_dump(self.config, sort_keys=False)
        )

    def snakemake(self, *targets: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(BIN / "snakemake"),
                "--snakefile",
                str(REPO / "Snakefile"),
                "--cores",
                "1",
                *targets,
            ],
            cwd=self.path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *targets: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                str(BIN / "snakemake"),
                "--snakefile",
                str(REPO / "Snakefile"),
                "--cores",
                "1",
                *targets,
            ],
            cwd=self.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: a kill takes its jobs too
        )

    def run_dir(self, run_id: str) -> Path:
        return self.path / "results" / "runs" / run_id


@pytest.fixture
def workdir(tmp_path: Path) -> Workdir:
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    return Workdir(tmp_path, tiny_config(study))
