"""The module rules of docs/architecture.md are import-linter contracts in pyproject.toml
(`[tool.importlinter]`, checked by `make lint` with `lint-imports`). These tests show that each
contract holds on the tree and that each one breaks on a violation planted in a copy of the
package: a contract that could not fail would guard nothing.

import-linter reads the import graph with grimp: every `import` counts wherever it stands (module
top level, inside a function, under `if TYPE_CHECKING:`), and a forbidden module reached through
another module breaks the contract too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def lint_imports(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the package found in `src`, with the repository's contracts."""
    shutil.copy(PYPROJECT, cwd / "pyproject.toml")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def broken(output: str) -> set[str]:
    """The names of the contracts the report marks BROKEN (a long name wraps over lines)."""
    flat = " ".join(output.split())
    return {
        contract["name"]
        for contract in contracts().values()
        if f"{' '.join(contract['name'].split())} BROKEN" in flat
    }


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A copy of src/servelab to plant violations in."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO / "src" / "servelab", src / "servelab", ignore=shutil.ignore_patterns("__pycache__")
    )
    return src


def plant(src: Path, module: str, line: str) -> None:
    path = src / Path(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _planted() -> None:\n    {line}\n")


def test_the_contracts_are_the_documented_rules() -> None:
    assert set(contracts()) == {
        "analysis-reads-artifacts-only",
        "engine-facts-know-no-backend",
        "client-knows-no-simulator",
        "no-import-cycles",
    }


def test_every_contract_is_kept_by_the_tree(tmp_path: Path) -> None:
    done = lint_imports(REPO / "src", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


# One violation per contract: (module to plant in, the import, the contract it breaks).
VIOLATIONS = {
    "analysis-reads-artifacts-only": (
        "servelab.analysis.tables",
        "import servelab.sim.run  # noqa",
    ),
    "engine-facts-know-no-backend": (
        "servelab.engines.gate",
        "from servelab.deploy import backend  # noqa",
    ),
    "client-knows-no-simulator": (
        "servelab.dispatch.sse",
        "import servelab.sim.server  # noqa",
    ),
    # servelab.artifacts is imported by nearly everything: it importing the campaign back closes
    # a cycle between two sibling packages.
    "no-import-cycles": (
        "servelab.artifacts.provenance",
        "import servelab.campaign.blocks  # noqa",
    ),
}


@pytest.mark.parametrize("contract_id", sorted(VIOLATIONS))
def test_a_planted_violation_breaks_its_contract(
    contract_id: str, planted: Path, tmp_path: Path
) -> None:
    module, line = VIOLATIONS[contract_id]
    plant(planted, module, line)
    done = lint_imports(planted, tmp_path)
    assert done.returncode != 0
    assert contracts()[contract_id]["name"] in broken(done.stdout), done.stdout


def test_a_forbidden_module_reached_through_another_breaks_the_contract(
    planted: Path, tmp_path: Path
) -> None:
    """The client importing a helper module that imports the simulator still knows the
    simulator: a new module in the client, itself clean, leads there."""
    helper = planted / "servelab" / "dispatch" / "_planted_helper.py"
    helper.write_text('"""A planted helper."""\n\nimport servelab.telemetry.canonical  # noqa\n')
    plant(planted, "servelab.telemetry.canonical", "import servelab.sim.run  # noqa")
    plant(planted, "servelab.dispatch.sse", "import servelab.dispatch._planted_helper  # noqa")
    done = lint_imports(planted, tmp_path)
    assert contracts()["client-knows-no-simulator"]["name"] in broken(done.stdout), done.stdout
