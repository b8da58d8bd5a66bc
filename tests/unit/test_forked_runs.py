"""tests/forked_runs.py: a command run in a fork of one interpreter sees and does what it would as
`python SCRIPT`, or as a console script, in a fresh one (the documented-commands test runs its
scripts' --help and its dry runs so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from forked_runs import run_forked

# prints what a script can see of how it was started, then exits 3
REPORT = """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__}))
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


def _scripts(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "scripts"
    folder.mkdir()
    texts = {
        "report": REPORT,
        "helpful": "import argparse\np = argparse.ArgumentParser()\np.add_argument('--alpha')\n"
        "p.parse_args()\n",
        "broken": "import no_such_module_of_servelab\n",
        "message": "import sys\nsys.exit('stopped: a message')\n",
        "sleeper": "import time\ntime.sleep(30)\n",
    }
    out = {}
    for name, text in texts.items():
        out[name] = folder / f"{name}.py"
        out[name].write_text(text)
    # a console script: no suffix, run by its shebang line
    out["console"] = folder / "console"
    out["console"].write_text(f"#!{sys.executable}\n{REPORT}")
    out["console"].chmod(0o755)
    return out


def _alone(cwd: Path, argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_a_forked_script_sees_and_exits_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    scripts = _scripts(tmp_path)
    cwd = tmp_path / "work"
    cwd.mkdir()
    jobs = [
        (cwd, (sys.executable, str(scripts["report"]), "--x", "1")),
        (cwd, (sys.executable, str(scripts["helpful"]), "--help")),
        (cwd, (sys.executable, str(scripts["broken"]))),
        (cwd, (sys.executable, str(scripts["message"]))),
        (cwd, (str(scripts["console"]), "-n", "target")),
    ]
    forked = run_forked(jobs, interpreter=sys.executable, timeout_s=60)
    alone = [_alone(folder, argv) for folder, argv in jobs]
    assert [r.returncode for r in forked] == [r.returncode for r in alone]
    for k in (0, 4):  # the reports: argv, sys.path[0], cwd and __name__, as run alone
        assert forked[k].stdout.splitlines()[0] == alone[k].stdout.splitlines()[0]
        assert "to stderr" in forked[k].stdout
    assert forked[0].returncode == 3
    assert "--alpha" in forked[1].stdout and forked[1].returncode == 0
    assert "ModuleNotFoundError: No module named 'no_such_module_of_servelab'" in forked[2].stdout
    assert forked[3].returncode == 1 and "stopped: a message" in forked[3].stdout
    assert forked[4].returncode == 3 and '"argv": ["' + str(scripts["console"]) in forked[4].stdout


def test_a_script_that_does_not_end_is_killed_at_its_timeout_and_the_rest_still_run(
    tmp_path: Path,
) -> None:
    scripts = _scripts(tmp_path)
    jobs = [
        (tmp_path, (sys.executable, str(scripts["sleeper"]))),
        (tmp_path, (sys.executable, str(scripts["helpful"]), "--help")),
    ]
    slow, fast = run_forked(jobs, interpreter=sys.executable, timeout_s=1.0)
    assert slow.returncode == -1 and "TimeoutExpired" in slow.stdout
    assert fast.returncode == 0 and "--alpha" in fast.stdout
