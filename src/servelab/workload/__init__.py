"""servelab.workload: seeded multi-agent trace compilation, validation and loading (docs/workload.md).

Public API (so Snakemake scripts stay thin):

- `compile_trace_files(*, condition, rep, seed, workload, tokenizer, trace_path, manifest_path) -> dict`:
  compile the trace of `condition` (a `servelab.grid.config.Condition`, whole), validate it, write both
  files atomically, return the manifest.
- `compile_from_config(config, condition, rep, *, trace_path, manifest_path) -> dict`: the same for one
  (condition, rep) of a validated config.
- `validate_trace(trace_path, manifest_path, *, retokenize=False) -> dict[str, bool]`: the six checks by name.
- `check_trace(...)`: the same, raising `TraceValidationError` naming each failed check and request/graph.
- `load_trace(trace_path, manifest_path) -> LoadedTrace`: validate, then the rows as `TraceRequest`s plus prompts.
- `warmup_prompts(seed, n, prompt_tokens, tokenizer) -> list[(text, ids)]`: warm-up prompts sharing no prefix
  with any trace.

A condition with an imported `trace` (config `conditions[].trace`) compiles through the same calls;
`servelab.workload.imported` (`read_records`, `import_trace`) imports a production trace outside a
config, as `servelab trace import` does. `checks_for(manifest)` names the checks a trace's kind must
pass (`CHECKS`, or an imported trace's `IMPORTED_CHECKS`).

The graph-release logic shared by the simulator and the dispatcher is `servelab.workload.release`.
transformers is imported only when a tokenizer is needed (compiling, warm-up prompts, `retokenize=True`).
"""

from servelab.workload.compiler import (
    WorkloadSettings,
    compile_from_config,
    compile_trace,
    compile_trace_files,
)
from servelab.workload.loader import LoadedTrace, Prompt, load_trace
from servelab.workload.prompts import PromptError, warmup_prompts
from servelab.workload.release import ReleaseTracker, TraceRequest
from servelab.workload.tokenizer import DEFAULT_TOKENIZER, TokenizerError, load_tokenizer
from servelab.workload.validate import (
    CHECKS,
    IMPORTED_CHECKS,
    TraceValidationError,
    check_trace,
    checks_for,
    validate_trace,
)

__all__ = [
    "CHECKS",
    "DEFAULT_TOKENIZER",
    "IMPORTED_CHECKS",
    "LoadedTrace",
    "Prompt",
    "PromptError",
    "ReleaseTracker",
    "TokenizerError",
    "TraceRequest",
    "TraceValidationError",
    "WorkloadSettings",
    "check_trace",
    "checks_for",
    "compile_from_config",
    "compile_trace",
    "compile_trace_files",
    "load_tokenizer",
    "load_trace",
    "validate_trace",
    "warmup_prompts",
]
