"""What a process pays before it does anything: the heavy libraries stay out of the imports that do
not use them.

Every Snakemake invocation imports the Snakefile's modules, and every job imports its script's; a
campaign starts hundreds of such processes. scipy.stats costs about a second of CPU to import,
matplotlib over half of one and pyarrow a tenth (docs/testing.md, "Where the time goes").
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from servelab import artifacts

REPO_COMMON_SMK = "workflow/rules/common.smk"
HEAVY = ("pyarrow", "scipy", "scipy.stats", "matplotlib", "pandas")


def loaded_after(statements: str) -> set[str]:
    """Which of HEAVY a fresh interpreter holds after running `statements`."""
    code = f"import sys\n{statements}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))


def test_the_snakefile_imports_no_heavy_library(repo) -> None:
    # the module-level imports of the rule helpers, as Snakemake runs them on every invocation
    text = (repo / REPO_COMMON_SMK).read_text()
    imports = [
        line for line in text.splitlines() if re.match(r"(import|from) servelab[.\w]* ", line)
    ]
    assert len(imports) >= 4, imports
    assert loaded_after("\n".join(imports)) == set()


@pytest.mark.parametrize(
    ("statement", "allowed"),
    [
        # a table, a run's metrics, the checksums: statistics and Parquet, never a figure
        ("from servelab.analysis import write_table", {"pyarrow"}),
        ("from servelab.analysis.slo import write_run_metrics", {"pyarrow"}),
        ("from servelab.analysis import record_checksums", {"pyarrow"}),
        # a deployment's manifests are text
        ("from servelab.campaign.deploy import render_manifests", set()),
        # `servelab analyze --help` builds its parser only
        ("import servelab.cli as cli; cli.build_parser('analyze')", {"pyarrow"}),
    ],
)
def test_a_job_imports_only_what_it_uses(statement: str, allowed: set[str]) -> None:
    assert loaded_after(statement) <= allowed


def test_scipy_stats_and_matplotlib_come_when_used() -> None:
    # the lazy imports are still imports: the analysis that draws and tests loads both
    assert "scipy.stats" in loaded_after(
        "from servelab.analysis import stats\nstats.log_summary([1.0, 2.0, 3.0])"
    )
    assert "matplotlib" in loaded_after("from servelab.analysis import figures")


def test_the_schemas_are_built_on_first_use_and_once() -> None:
    assert loaded_after("import servelab.artifacts") == set()
    assert loaded_after("import servelab.artifacts as a\nhasattr(a, 'no_such_name')") == set()
    assert loaded_after("from servelab.artifacts import TRACE_SCHEMA") == {"pyarrow"}
    assert artifacts.TRACE_SCHEMA is artifacts.TRACE_SCHEMA
    assert artifacts.REQUESTS_SCHEMA.field("status").nullable is False
    with pytest.raises(AttributeError, match="NO_SUCH_SCHEMA"):
        _ = artifacts.NO_SUCH_SCHEMA
