"""servelab.analysis: run artifacts -> the study's statistics, Tables 3-6, Figures 1 and 6-14.

Reads artifacts only (through `servelab.artifacts`); never imports sim, dispatch, deploy or
telemetry. See docs/analysis.md for every definition and the missing-data policy.

The names below are loaded on first use (PEP 562): importing one submodule, as the Snakefile's
parse-time code does through `servelab.capacity.method`, must not import scipy.stats and matplotlib
(2 s, paid by every snakemake invocation). The function `verify` is imported from its
submodule, `servelab.analysis.verify`, whose name it shares.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the submodule that defines it
_EXPORTS = {
    "AnalysisResult": "pipeline",
    "VerificationError": "pipeline",
    "analyze": "pipeline",
    "build_analysis": "pipeline",
    "verify_against_checksums": "pipeline",
    "write_figures": "pipeline",
    "write_numbers": "pipeline",
    "write_table": "pipeline",
    "discover_restart_records": "restarts",
    "read_restart_record": "restarts",
    "PoolingError": "runs",
    "RunSet": "runs",
    "discover_run_dirs": "runs",
    "load_runs": "runs",
    "read_manifests": "runs",
    "Analysis": "summary",
    "Mismatch": "verify",
    "analysis_outputs": "verify",
    "record_checksums": "verify",
}

__all__ = [
    "Analysis",
    "AnalysisResult",
    "Mismatch",
    "PoolingError",
    "RunSet",
    "VerificationError",
    "analysis_outputs",
    "analyze",
    "build_analysis",
    "discover_restart_records",
    "discover_run_dirs",
    "load_runs",
    "read_manifests",
    "read_restart_record",
    "record_checksums",
    "verify_against_checksums",
    "write_figures",
    "write_numbers",
    "write_table",
]

if TYPE_CHECKING:
    from servelab.analysis.pipeline import (
        AnalysisResult,
        VerificationError,
        analyze,
        build_analysis,
        verify_against_checksums,
        write_figures,
        write_numbers,
        write_table,
    )
    from servelab.analysis.restarts import discover_restart_records, read_restart_record
    from servelab.analysis.runs import (
        PoolingError,
        RunSet,
        discover_run_dirs,
        load_runs,
        read_manifests,
    )
    from servelab.analysis.summary import Analysis
    from servelab.analysis.verify import Mismatch, analysis_outputs, record_checksums


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'servelab.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"servelab.analysis.{module}"), name)
    globals()[name] = value
    return value
