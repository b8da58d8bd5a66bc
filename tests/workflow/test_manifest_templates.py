"""Manifest templates are inputs of the workflow: over a completed tiny sim campaign (tests/campaigns.py's
tiny_config), editing one template plans render_manifests and deploy
for exactly the deployments rendered from it.

The templates are package data of the servelab that Python imports. For the dev venv that is an
editable install of this checkout, so a scratch copy's templates would be ignored: every
snakemake here runs with PYTHONPATH at the scratch copy's src/, whose package (and templates) then
win over the installed one (checked first, since every other assertion rests on it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from campaigns import Workdir, study_config, tiny_config

from servelab.deploy.manifests import load_rendered

# The module's fixture is one costly set-up: every test of it on one xdist worker, so that the
# two workers do not each build it.
pytestmark = pytest.mark.xdist_group("manifest-templates")

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TARGET = "results/table5.csv"
CAMPAIGN_TIMEOUT_S = 600
PLAN_TIMEOUT_S = 180


class Scratch:
    """A copy of the workflow and the package, with a completed tiny sim campaign."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.templates = root / "src" / "servelab" / "deploy" / "templates"
        self.env = {**os.environ, "PYTHONPATH": str(root / "src")}

    def snakemake(self, *args: str, timeout: float = PLAN_TIMEOUT_S) -> str:
        result = subprocess.run(
            [str(BIN / "snakemake"), *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        return result.stdout + result.stderr

    def planned(self) -> dict[str, int]:
        """Jobs by rule in the dry run's job table ({} when nothing is to be done)."""
        output = self.snakemake("-n", "--", TARGET)
        if "Job stats:" not in output:
            assert "Nothing to be done" in output, output[-4000:]
            return {}
        counts = {}
        for line in output.split("Job stats:", 1)[1].splitlines()[3:]:
            match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
            if not match:
                break
            counts[match.group(1)] = int(match.group(2))
        return counts

    def pending_renders(self) -> set[str]:
        """The deployments whose manifest the plan would render again (from --summary)."""
        pending = set()
        for line in self.snakemake("--summary", "--", TARGET).splitlines():
            cells = line.split("\t")
            if len(cells) >= 6 and cells[2] == "render_manifests" and cells[-1] != "no update":
                pending.add(Path(cells[0]).stem)
        return pending

    def manifests(self) -> dict[str, Path]:
        return {p.stem: p for p in sorted((self.root / "results" / "manifests").glob("*.yaml"))}

    def render_all(self) -> None:
        """Run the render rule for every manifest (those up to date are left alone)."""
        targets = [str(p.relative_to(self.root)) for p in self.manifests().values()]
        self.snakemake("--cores", "1", "--", *targets)

    @contextmanager
    def edited(self, template: str, old: str, new: str) -> Iterator[Path]:
        """`template` with `old` replaced by `new`; its original text is back afterwards."""
        path = self.templates / template
        original = path.read_text(encoding="utf-8")
        assert old in original, f"{template} no longer contains {old!r}"
        path.write_text(original.replace(old, new), encoding="utf-8")
        try:
            yield path
        finally:
            path.write_text(original, encoding="utf-8")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Scratch:
    # Its own campaign, not a copy of the session's: the templates' paths are inputs, and here
    # they are the scratch package's.
    root = tmp_path_factory.mktemp("manifest-templates")
    Workdir(root, tiny_config(study_config()))
    for name in ("Snakefile", "environment.yml"):  # rules name environment.yml (conda:)
        shutil.copy(REPO / name, root / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("workflow", "profiles", "src"):
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    here = Scratch(root)
    here.snakemake("--cores", "1", "--", TARGET, timeout=CAMPAIGN_TIMEOUT_S)
    return here


def engines_of(scratch: Scratch) -> dict[str, str]:
    """Deployment id -> engine, read from the campaign's rendered manifests."""
    engines = {}
    for deployment, path in scratch.manifests().items():
        (deployment_object,) = [o for o in load_rendered(path) if o["kind"] == "Deployment"]
        engines[deployment] = deployment_object["metadata"]["labels"]["app.kubernetes.io/name"]
    return engines


def test_the_scratch_copy_renders_with_its_own_templates(scratch: Scratch) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from servelab.deploy import manifests; print(manifests.templates_dir())",
        ],
        env=scratch.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(result.stdout.strip()) == scratch.templates
    assert scratch.planned() == {}, "a completed campaign plans nothing"


def test_editing_the_sglang_template_re_renders_and_redeploys_only_sglang(
    scratch: Scratch,
) -> None:
    engines = engines_of(scratch)
    sglang = {d for d, engine in engines.items() if engine == "sglang"}
    assert sglang and sglang != set(engines), "the grid must mix engines for this to mean much"
    before = {d: (p.read_bytes(), p.stat().st_mtime_ns) for d, p in scratch.manifests().items()}

    with scratch.edited("deployment.sglang.yaml.j2", "is too small.", "is too small (edited)."):
        planned = scratch.planned()
        assert planned.get("render_manifests") == len(sglang), planned
        assert planned.get("deploy") == len(sglang), planned
        assert scratch.pending_renders() == sglang
        # Render them: exactly SGLang's manifests are rewritten, with the edit in them.
        scratch.render_all()
        for deployment, path in scratch.manifests().items():
            if deployment in sglang:
                assert "is too small (edited)." in path.read_text()
            else:
                assert (path.read_bytes(), path.stat().st_mtime_ns) == before[deployment]

    # The template is back as it was: SGLang's manifests render again, to their old bytes, and a
    # manifest whose bytes did not change redeploys nothing.
    assert scratch.pending_renders() == sglang
    scratch.render_all()
    assert {d: p.read_bytes() for d, p in scratch.manifests().items()} == {
        d: text for d, (text, _) in before.items()
    }
    assert scratch.planned() == {}


def test_editing_a_common_template_re_renders_and_redeploys_every_deployment(
    scratch: Scratch,
) -> None:
    deployments = set(engines_of(scratch))
    with scratch.edited("service.yaml.j2", 'type: "ClusterIP"', 'type: "ClusterIP" # edited'):
        planned = scratch.planned()
        assert planned.get("render_manifests") == len(deployments), planned
        assert planned.get("deploy") == len(deployments), planned
        assert scratch.pending_renders() == deployments
    # Restored unrendered: its content is the one the manifests were rendered from.
    assert scratch.planned() == {}


def test_a_template_touched_but_not_changed_plans_nothing(scratch: Scratch) -> None:
    for path in sorted(scratch.templates.glob("*.j2")):
        path.touch()  # a newer mtime, the same bytes: Snakemake compares their checksums
    assert scratch.planned() == {}
    assert scratch.pending_renders() == set()
