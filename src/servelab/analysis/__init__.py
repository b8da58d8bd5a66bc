"""servelab.analysis: run artifacts -> the study's statistics, Tables 3-6, Figures 1 and 6-14.

Reads artifacts only (through `servelab.artifacts`); never imports sim, dispatch, deploy or
telemetry. See docs/analysis.md for every definition and the missing-data policy.
"""

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
from servelab.analysis.verify import Mismatch, analysis_outputs, record_checksums, verify

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
    "verify",
    "verify_against_checksums",
    "write_figures",
    "write_numbers",
    "write_table",
]
