"""The campaign Job resumes with nothing redone: shown where the resuming happens, the workflow.

When the Job's pod is lost, the Job starts another pod that runs the same command on the same
volume (tests/unit/test_campaign_job.py shows that on the fake API server). Whether that redoes
anything is up to the workflow (atomic writes, skip-if-done, rerun-incomplete and nolock in
profiles/default/config.yaml), so this test runs *the Job's rendered command* in the *image's
layout* and kills it the way a deleted pod dies (SIGKILL to every process), then runs it again:

- a checkout (the image's /opt/servelab) whose `results` and `.snakemake` are links into a
  separate folder (the campaign volume at /work), made as the init container makes them;
- the configuration files the ConfigMap holds (the submitted file, then the in-cluster overlay),
  in a folder of their own (/etc/servelab/config), named as the Job's arguments name them;
- the Job's container arguments, read from the rendered job.yaml, the configuration folder
  mapped to that folder; the workflow's own Snakefile and profile.

What a test here cannot be: a container. The pod boundary, the volume's attach and detach, and the
Job controller are the cluster's; the command, the files and their layout are exactly the Job's.
The campaign runs on the sim backend, as `servelab campaign submit` allows for a rehearsal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import yaml
from campaigns import BIN, REPO, Workdir, study_config, tiny_config

from servelab.deploy.job_manifests import CONFIG_DIR, CampaignSpec, render_campaign
from servelab.grid.settings import KubernetesSettings

IMAGE = "registry.example/servelab@sha256:" + "0" * 64
RUNS = [f"defaults/{e}/rate-0.28/rep{r}" for e in ("vllm", "sglang") for r in (1, 2)]
TARGETS = [f"results/runs/{run}/telemetry.parquet" for run in RUNS]


def job_command(tmp_path: Path) -> tuple[list[str], Path, Path]:
    """(the Job's snakemake command here, the checkout, the volume)."""
    checkout, volume, config_dir = tmp_path / "checkout", tmp_path / "volume", tmp_path / "etc"
    Workdir(checkout, tiny_config(study_config()))  # the image's config/config.yaml
    for folder in ("results", ".snakemake"):  # the init container's mkdir; the image's links
        (volume / folder).mkdir(parents=True)
        (checkout / folder).symlink_to(volume / folder, target_is_directory=True)
    submitted = "# the campaign's overrides\nbackend: sim\n"
    spec = CampaignSpec(
        KubernetesSettings(), IMAGE, {"01-campaign.yaml": submitted}, tuple(TARGETS)
    )
    rendered = render_campaign(spec)
    config_dir.mkdir()
    for key, text in yaml.safe_load(rendered["configmap.yaml"])["data"].items():
        (config_dir / key).write_text(text)
    [container] = yaml.safe_load(rendered["job.yaml"])["spec"]["template"]["spec"]["containers"]
    args = [arg.replace(CONFIG_DIR, str(config_dir)) for arg in container["args"]]
    command = [str(BIN / container["command"][0]), "--snakefile", str(REPO / "Snakefile"), *args]
    return command, checkout, volume


def test_the_jobs_command_killed_and_run_again_on_its_volume_redoes_nothing(tmp_path: Path) -> None:
    command, checkout, volume = job_command(tmp_path)
    first = subprocess.Popen(
        command,
        cwd=checkout,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the kill takes its jobs too
    )
    done = volume / "results" / "runs" / RUNS[0] / "run.json"
    deadline = time.monotonic() + 300
    while not done.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    assert done.exists(), (first.stdout.read() if first.poll() is not None else "")[-3000:]
    time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # a deleted pod: every process of it, at once
    first.wait(timeout=30)

    # the same measurement is the same inode and bytes (a resumed job publishes a sealed run again
    # as a hard link, and Snakemake touches a finished job's outputs: not the mtime)
    finished = {
        p: (p.stat().st_ino, p.read_bytes()) for p in (volume / "results").glob("runs/**/run.json")
    }
    assert finished and all(json.loads(p.read_text()) for p in finished)
    left = [target for target in TARGETS if not (volume / target).is_file()]
    assert left, "the campaign finished before the kill: nothing was left to resume"

    again = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    for path, (inode, content) in finished.items():
        assert path.stat().st_ino == inode, f"{path} was measured again"
        assert path.read_bytes() == content, f"{path} changed"
    for target in TARGETS:
        assert (volume / target).is_file(), target
    # Everything the campaign wrote is on the volume: the checkout's two folders are still links.
    assert (checkout / "results").is_symlink() and (checkout / ".snakemake").is_symlink()
    assert (volume / ".snakemake" / "log").is_dir()
