"""The processes servelab starts on this machine: started, checked and stopped by their own PIDs.

Two kinds. The local backend's servers and Prometheus (`servelab.deploy.local`,
`servelab.deploy.local_prometheus`) are detached (`spawn`: a session of their own, outliving the
job that started them), found again from a state file by PID and a marker of their command line
(`alive`, guarding against PID reuse), and stopped by that PID, then what is left of the process
group they lead (`terminate`, `kill_group`). A server a script or a test holds for a while
(`servelab.deploy.llama_server.LlamaServerProcess`, the capture tools, the engines tier's
servers) is a `subprocess.Popen` of its own (`start_logged`), waited for on its /health
(`wait_healthy`, bounded) and stopped by its PID, then its process group (`stop_process`).
Nothing here stops a process by its name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "HOST",
    "START_LOCK",
    "STOP_TIMEOUT_S",
    "LocalError",
    "alive",
    "exclusive",
    "free_port",
    "group_members",
    "kill_group",
    "pinned",
    "port_free",
    "read_state",
    "spawn",
    "start_logged",
    "stop_process",
    "tail",
    "terminate",
    "wait_healthy",
]

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 10.0

# Processes started by this Python process, so they can be reaped (no zombies) when stopped.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class LocalError(RuntimeError):
    """A local process could not be started, reached or stopped; the message says which and why."""


# Beside the servers' state files: held while a process picks a free port and starts listening on
# it, so N jobs starting servers at once (config campaign.gpu_nodes) never pick the same port.
START_LOCK = ".start.lock"


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `lock_path` (created if missing) for the block; the
    kernel releases it if the holder dies, so a killed job never leaves it held."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def alive(pid: int | None, marker: str) -> bool:
    """True if `pid` runs and its command line contains `marker` (guards against pid reuse)."""
    if not pid:
        return False
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    if state in ("Z", "X"):
        return False
    # While `taskset` execs a pinned server, the command line reads empty for an instant: a child
    # of this process that is still running is the one it started.
    return marker in cmdline or (not cmdline.strip() and child is not None)


def pinned(cmd: list[str], cpus: Sequence[int]) -> list[str]:
    """`cmd` run on `cpus` only (util-linux `taskset`; its children inherit the mask), or as it
    is when no cores are named."""
    if not cpus:
        return list(cmd)
    return ["taskset", "--cpu-list", ",".join(str(c) for c in cpus), *cmd]


def spawn(
    cmd: list[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cpus: Sequence[int] = (),
) -> int:
    """Start `cmd` detached (a session of its own, its output appended to `log_path`), on `cpus`
    when named; return its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(  # detached: outlives the job that deployed it
            pinned(cmd, cpus),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of the process group a server led, and wait (bounded) until it is
    gone. The server was started as a session of its own, so the group's id is its pid, and Linux
    gives no new process a pid that is still a live group's id: only what that server started
    (vLLM's engine core and worker) is in it, even after the server itself has died."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(100):  # bounded: 5 s
        if not group_members(pgid):
            return
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`: zombies (dead, waiting for a parent to reap
    them, which an init that does not reap never does) are not counted."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def terminate(pid: int | None, marker: str, *, kill: bool = False) -> bool:
    """Stop `pid` (SIGTERM, then SIGKILL after STOP_TIMEOUT_S; SIGKILL at once with `kill`), then
    what is left of its process group; False when the server was not running (its group, if any
    is left, is stopped all the same)."""
    if not alive(pid, marker):
        # the server died on its own (a crash, a kill): its orphans keep its group, whose id no
        # new process can take while they live. A live process under that pid is another's.
        if pid and not Path(f"/proc/{pid}").exists():
            kill_group(pid)
        return False
    assert pid is not None  # alive() is False without one
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while alive(pid, marker) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if alive(pid, marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(100):  # bounded
            _reap(pid)
            if not alive(pid, marker):
                break
            time.sleep(0.05)
    _reap(pid)
    kill_group(pid)
    return True


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log, or "(no log)"."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def read_state(path: Path) -> dict[str, Any] | None:
    """A state file's JSON, or None when it is missing or unreadable."""
    try:
        state: dict[str, Any] | None = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state


# --------------------------------------------------------------------------- held processes


def start_logged(
    command: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    stdout_to_log: bool = True,
) -> subprocess.Popen[bytes]:
    """`command` started in a session (a process group) of its own, its stderr (and its stdout,
    else discarded) written to `log_path`, with `env` over this process's environment."""
    with log_path.open("wb") as out:
        return subprocess.Popen(
            list(command),
            stdout=out if stdout_to_log else subprocess.DEVNULL,
            stderr=out if not stdout_to_log else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def wait_healthy(
    url: str,
    proc: subprocess.Popen[bytes],
    *,
    timeout_s: float,
    log_path: Path,
    what: str = "the server",
    poll_s: float = 0.1,
) -> None:
    """Return once GET `url`/health answers 200; LocalError (with the log's tail) when `proc`
    exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise LocalError(
                f"{what} (pid {proc.pid}) exited with {proc.returncode} while starting; "
                f"{log_path} ends with:\n{tail(log_path)}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        if time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    raise LocalError(
        f"{what} (pid {proc.pid}) at {url} not healthy within {timeout_s:g} s; "
        f"{log_path} ends with:\n{tail(log_path)}"
    )


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a process this one started in a session of its own: by its PID (SIGCONT, since a
    stopped process holds SIGTERM back, and SIGTERM; SIGKILL after `timeout_s`; each wait
    bounded), then SIGKILL to what is left of the process group it leads (vLLM's engine core,
    SGLang's scheduler are its children)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
