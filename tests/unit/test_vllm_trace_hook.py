"""benchmarks/vllm_trace/sitecustomize.py on a stand-in `vllm` package: it patches the modules it
names as they are imported, logs their events with the clock line first, says so when a module's
names have moved (and leaves it working), and does nothing without SERVELAB_VLLM_TRACE_DIR."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "benchmarks" / "vllm_trace"

SCHEDULER = """
class _New:
    req_id = "cmpl-r1-0-0a1b2c3d"

class _Output:
    scheduled_new_reqs = [_New()]
    total_num_scheduled_tokens = 7
    num_scheduled_tokens = {"cmpl-r1-0-0a1b2c3d": 7}

class Scheduler:
    def __init__(self):
        self.waiting, self.running, self.requests = [], [], {}
    def add_request(self, request):
        self.waiting.append(request)
        self.requests[request.request_id] = request
    def schedule(self):
        # as vLLM's: the waiting request runs, its computed tokens advanced by the step's
        request = self.waiting.pop()
        self.running.append(request)
        request.num_computed_tokens += 7
        return _Output()
    def update_from_output(self, scheduler_output, model_output):
        return {"outputs": len(self.waiting)}
"""

DRIVER = """
import vllm.v1.core.sched.scheduler as sched
import vllm.v1.engine.core as core
s = sched.Scheduler()
s.add_request(
    type(
        "R",
        (),
        {"request_id": "cmpl-r1-0-0a1b2c3d", "num_computed_tokens": 64, "num_prompt_tokens": 80},
    )()
)
s.schedule()
assert s.update_from_output(None, None) == {"outputs": 0}
assert core.ENGINE == "moved"
print("served")
"""


def stand_in_vllm(root: Path) -> None:
    for package in ("vllm", "vllm/v1", "vllm/v1/core", "vllm/v1/core/sched", "vllm/v1/engine"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "vllm/v1/core/sched/scheduler.py").write_text(textwrap.dedent(SCHEDULER))
    # a release whose engine core has no EngineCoreProc: the patch fails, the module still works
    (root / "vllm/v1/engine/core.py").write_text('ENGINE = "moved"\n')


def run(tmp_path: Path, trace_dir: Path | None) -> subprocess.CompletedProcess[str]:
    stand_in_vllm(tmp_path / "pkgs")
    env = {k: v for k, v in os.environ.items() if k != "SERVELAB_VLLM_TRACE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK), str(tmp_path / "pkgs")])
    if trace_dir is not None:
        trace_dir.mkdir()
        env["SERVELAB_VLLM_TRACE_DIR"] = str(trace_dir)
    return subprocess.run(
        [sys.executable, "-c", DRIVER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_hook_patches_on_import_and_logs_each_event(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    done = run(tmp_path, trace)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "served"
    (log,) = trace.glob("*.log")
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    kinds = [r[2] for r in rows]
    assert kinds[0] == "clock"
    assert kinds[1:] == [
        "patched",
        "patch_failed",
        "ec_queued",
        "ec_sched",
        "ec_update_in",
        "ec_stepend",
    ]
    assert rows[1][3] == "vllm.v1.core.sched.scheduler"
    assert rows[2][3] == "vllm.v1.engine.core" and "EngineCoreProc" in rows[2][4]
    assert rows[3][3:] == ["cmpl-r1-0-0a1b2c3d", "0", "0"]
    start = float(rows[4][3])
    # 7 tokens after a 64-token cached prefix, the scheduler's queues after the step
    assert rows[4][4:] == ["cmpl-r1-0-0a1b2c3d", "7", "1", "0", "1", "cmpl-r1-0-0a1b2c3d:7:64:80"]
    times = [float(r[0]) for r in rows]
    assert times == sorted(times) and start <= float(rows[4][0])


def test_without_a_trace_folder_nothing_is_patched(tmp_path: Path) -> None:
    done = run(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("*.log"))
