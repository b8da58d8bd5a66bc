"""The repository's Dockerfile (servelab's image for the campaign Job), checked by its structure:
no image can be built here (no container runtime), so what is checked is what the file says.

- its one base image is python:3.11-slim-bookworm pinned by digest (the lock's Python);
- the locked runtime environment is installed with its hashes, then servelab with nothing else;
- it runs as a non-root user, with `snakemake` as its entrypoint;
- no secret is baked in: no instruction names a token, key, password or credential, nothing
  copies a kubeconfig, and the build context (.dockerignore) holds only what the Dockerfile copies;
- the layout is the one the Job's manifests expect (servelab.deploy.job_manifests): the checkout,
  its `results` and `.snakemake` links into the volume's mount, the user id.

Each rule can fail: a planted bad Dockerfile is checked too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servelab.deploy.job_manifests import CHECKOUT, UID, WORK_DIR

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
SECRET_WORDS = re.compile(r"token|secret|passw|credential|api[_-]?key|private[_-]?key", re.I)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def problems(text: str) -> list[str]:
    found = []
    steps = instructions(text)
    froms = [args for op, args in steps if op == "FROM"]
    if len(froms) != 1 or not re.fullmatch(
        r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", froms[0].split()[0]
    ):
        found.append(f"base image not python:3.11-slim-bookworm pinned by digest: {froms}")
    runs = " ".join(args for op, args in steps if op == "RUN")
    if not re.search(r"pip install --require-hashes --no-deps -r requirements/verify\.lock", runs):
        found.append("the locked environment is not installed with its hashes")
    if not re.search(r"pip install --no-deps --no-build-isolation \.(\s|$)", runs):
        found.append("servelab is not installed from the checkout with nothing the lock lacks")
    users = [args.split(":")[0] for op, args in steps if op == "USER"]
    if not users or users[-1] in ("0", "root") or not users[-1].isdigit():
        found.append(f"the image does not end as a numeric non-root user: {users}")
    entrypoints = [args for op, args in steps if op == "ENTRYPOINT"]
    if entrypoints != ['["snakemake"]']:
        found.append(f"entrypoint is not snakemake (exec form): {entrypoints}")
    for op, args in steps:
        if op in ("ENV", "ARG", "LABEL") and SECRET_WORDS.search(args):
            found.append(f"{op} names a secret: {args}")
        if op in ("COPY", "ADD") and re.search(r"kube|\.ssh|\.netrc|secret|token|\.env\b", args):
            found.append(f"{op} copies credentials: {args}")
        if op == "ADD":
            found.append(f"ADD (remote or archive magic) instead of COPY: {args}")
        if op == "RUN" and "--mount=type=secret" in args:
            found.append("a build secret is used (it would have to be handled)")
    return found


def test_the_dockerfile_keeps_every_rule() -> None:
    assert problems(DOCKERFILE.read_text()) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("@sha256:", ":latest #"), "pinned by digest"),
        (("USER 10001:10001", "USER root"), "non-root"),
        (('ENTRYPOINT ["snakemake"]', "ENTRYPOINT snakemake"), "entrypoint"),
        (("ARG SERVELAB_GIT_COMMIT=unknown", "ARG HF_TOKEN=hf_x"), "names a secret"),
        (
            ("COPY profiles ./profiles", "COPY profiles ./profiles\nCOPY .kube/config /tmp/kc"),
            "credentials",
        ),
        (("--require-hashes ", ""), "hashes"),
    ],
)
def test_a_broken_dockerfile_is_caught(change: tuple[str, str], expected: str) -> None:
    text = DOCKERFILE.read_text()
    assert change[0] in text
    assert any(expected in p for p in problems(text.replace(change[0], change[1], 1)))


def test_the_image_layout_is_what_the_job_expects() -> None:
    steps = instructions(DOCKERFILE.read_text())
    workdirs = [args for op, args in steps if op == "WORKDIR"]
    assert workdirs == [CHECKOUT]
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert f"ln -s {WORK_DIR}/results results" in runs
    assert f"ln -s {WORK_DIR}/.snakemake .snakemake" in runs
    assert f"--uid {UID}" in runs and [a for o, a in steps if o == "USER"] == [f"{UID}:{UID}"]


def test_the_base_python_is_the_locks() -> None:
    """The lock is resolved for CPython 3.11 (tools/lock-verify-env.sh) and pins the workflow."""
    assert "--python-version 3.11" in (REPO / "tools" / "lock-verify-env.sh").read_text()
    lock = (REPO / "requirements" / "verify.lock").read_text()
    for name in ("snakemake", "kubernetes", "jinja2", "setuptools"):
        assert re.search(rf"^{name}==", lock, re.M), name


def test_the_build_context_holds_what_is_copied_and_nothing_secret() -> None:
    steps = instructions(DOCKERFILE.read_text())
    copied = [
        source
        for op, args in steps
        if op == "COPY"
        for source in args.split()[:-1]
        if not source.startswith("--")
    ]
    ignore = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*", "the build context is an allowlist"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for source in copied:
        assert (REPO / source).exists(), source
        assert source.rstrip("/") in allowed or source.split("/")[0] in allowed, source
    for never in (".git", ".venv", "results", ".snakemake", "tests"):
        assert never not in allowed
    assert "config/kubernetes.yaml" in rules  # a campaign's own overrides stay out


def test_the_commit_reaches_the_run_records(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without .git (the image), the commit the build recorded is servelab's provenance."""
    from servelab.artifacts import provenance

    text = DOCKERFILE.read_text()
    assert f"{provenance.COMMIT_ENV}=${{{provenance.COMMIT_ENV}}}" in text
    provenance.git_commit.cache_clear()
    try:
        monkeypatch.setenv(provenance.COMMIT_ENV, "0b123c4" + "0" * 33)
        assert provenance.git_commit(str(tmp_path)) == "0b123c4" + "0" * 33
        monkeypatch.setenv(provenance.COMMIT_ENV, "not a commit; rm -rf /")
        provenance.git_commit.cache_clear()
        assert provenance.git_commit(str(tmp_path)) == "unknown"
    finally:
        provenance.git_commit.cache_clear()
