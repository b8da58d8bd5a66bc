"""Shared fixtures (the repository root and the study configuration), and the notice printed at the
end of a run when a test tier was skipped because a system package is missing."""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SystemTier:
    """Tests that need a program from a system package, not from pip: skipped without it."""

    marker: str
    name: str
    program: str
    install: str
    # "module:function" returning the program's path or None: the lookup the code itself uses
    lookup: str

    def program_found(self) -> bool:
        module, _, function = self.lookup.partition(":")
        return getattr(importlib.import_module(module), function)() is not None


# Each tier's tests carry `marker` and skip themselves when the program is missing. This table
# only makes that skip loud: otherwise a newcomer sees an "s" in the progress line, and one reason
# among many in the short summary, and may never learn that a whole tier did not run.
SYSTEM_TIERS = (
    SystemTier(
        marker="prometheus",
        name="the live-Prometheus tier",
        program="prometheus",
        install="apt-get install prometheus (Debian/Ubuntu), "
        "or set SERVELAB_PROMETHEUS=/path/to/prometheus",
        lookup="servelab.deploy.local:prometheus_binary",
    ),
    SystemTier(
        marker="llamacpp",
        name="the real-engine (llama.cpp llama-server) tier",
        program="llama-server",
        install="make llama-server (builds it from the pinned llama-cpp-python sdist), "
        "or set SERVELAB_LLAMA_SERVER=/path/to/llama-server",
        lookup="servelab.deploy.llama_server:llama_server_binary",
    ),
)


def skip_notices(skipped: list[pytest.TestReport]) -> list[str]:
    """One line per system tier whose tests were skipped while its program is missing."""
    lines = []
    for tier in SYSTEM_TIERS:
        count = sum(1 for report in skipped if tier.marker in report.keywords)
        if count and not tier.program_found():
            lines.append(
                f"SKIPPED {tier.name} ({count} tests marked '{tier.marker}'): "
                f"the `{tier.program}` program is not installed. Install it with: {tier.install}"
            )
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if hasattr(r, "keywords")]
    for line in skip_notices(skipped):
        terminalreporter.write_line(line, yellow=True, bold=True)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def _study_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.fixture
def study_config(_study_config: dict) -> dict:
    """A fresh, mutable copy of config/config.yaml."""
    return copy.deepcopy(_study_config)
