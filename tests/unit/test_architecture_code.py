"""docs/architecture.md against the code: its package table names every package and module of
src/servelab (and nothing that is not there), every function its data flow names exists and every
rule it names is a rule of the workflow, and its module rules are the import contracts of
pyproject.toml. A newcomer reads the page first; these tests keep it true.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "servelab"
DOC = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")


def section(heading: str, text: str = DOC) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/architecture.md has no section '## {heading}'"
    return match.group(1)


def package_rows(text: str) -> dict[str, str]:
    """The package table: {`servelab.x`: the row's text}."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"\| `(servelab(?:\.\w+)?)` \|(.*)\|$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def tree() -> dict[str, list[str]]:
    """Every top-level package and module of servelab: {dotted name: its direct submodules}."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            found[f"servelab.{path.name}"] = sorted(
                child.stem if child.is_file() else child.name
                for child in path.iterdir()
                if (child.suffix == ".py" and child.stem != "__init__")
                or (child.is_dir() and (child / "__init__.py").exists())
            )
        elif path.suffix == ".py" and path.stem != "__init__":
            found[f"servelab.{path.stem}"] = []
    return found


def resolves(dotted: str) -> bool:
    """`servelab.a.b.c` is a module, or an attribute of the longest module it starts with."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


# ----------------------------------------------------------------------------- the package table


def test_the_table_reader_sees_rows_and_the_tree_reader_sees_packages() -> None:
    rows = package_rows("| `servelab.x` | the x |\n| `servelab.y.z` | no |\n| other |\n")
    assert rows == {"servelab.x": " the x "}
    assert "servelab.campaign" in tree() and "blocks" in tree()["servelab.campaign"]


def test_the_package_table_names_every_package_and_module_of_the_tree() -> None:
    rows = package_rows(section("Packages"))
    assert sorted(rows) == sorted(tree()), (
        "docs/architecture.md's package table and src/servelab differ: "
        f"only in the table {sorted(set(rows) - set(tree()))}, "
        f"only in the tree {sorted(set(tree()) - set(rows))}"
    )


@pytest.mark.parametrize("package", sorted(name for name, subs in tree().items() if subs))
def test_every_module_of_a_package_is_named_in_its_row(package: str) -> None:
    """In its package's row, or (the engine facts) in the engine registry's table."""
    row = package_rows(section("Packages"))[package]
    short = package.removeprefix("servelab.")
    named = set(re.findall(r"`([\w.]+)`", row))
    if package == "servelab.engines":
        named |= set(re.findall(r"`engines\.([\w]+)`", section("Engine registry")))
        named |= set(re.findall(r"`\.(\w+)`", section("Engine registry")))
    missing = [
        module
        for module in tree()[package]
        if not named & {module, f"{short}.{module}", f"{package}.{module}"}
    ]
    assert not missing, f"docs/architecture.md names no {missing} for {package}"


def test_every_servelab_name_the_packages_section_gives_exists() -> None:
    names = set(re.findall(r"`(servelab(?:\.\w+)+)`", section("Packages")))
    assert names
    assert not sorted(n for n in names if not resolves(n))


# ----------------------------------------------------------------------------- the data flow


def data_flow() -> str:
    block = re.search(r"```\n(.*?)```", section("Data flow of a run"), re.S)
    assert block
    return block.group(1)


def workflow_rules() -> set[str]:
    return {
        name
        for path in (REPO / "workflow" / "rules").glob("*.smk")
        for name in re.findall(r"^rule (\w+):", path.read_text(encoding="utf-8"), re.M)
    }


def test_the_resolver_tells_a_missing_function() -> None:
    assert resolves("servelab.campaign.blocks.execute_block")
    assert not resolves("servelab.campaign.blocks.execute_nothing")
    assert not resolves("servelab.nothing_here")


def test_every_function_the_data_flow_names_exists() -> None:
    names = set(re.findall(r"servelab(?:\.\w+)+", data_flow()))
    assert len(names) >= 8
    assert not sorted(n for n in names if not resolves(n))


def test_every_step_of_the_data_flow_is_a_rule_of_the_workflow() -> None:
    steps = set()
    for line in data_flow().splitlines():
        match = re.match(r"^([a-z_]+)(?: \+ [a-z]+| \(\w+\))?\s{2,}", line)
        if match:
            steps.add(match.group(1))
    assert {"compile_trace", "render_manifests", "deploy", "run", "telemetry"} <= steps
    assert not sorted(steps - workflow_rules() - {"analysis"})


# ----------------------------------------------------------------------------- the module rules


def test_the_module_rules_are_the_import_contracts() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}
    text = section("Module rules")
    items = re.split(r"^\d\. ", text, flags=re.M)[1:]
    by_id = {}
    for item in items:
        ids = re.findall(r"\(`([a-z-]+)`\)", item)
        assert len(ids) == 1, item
        by_id[ids[0]] = item
    assert sorted(by_id) == sorted(contracts)
    for contract_id, contract in contracts.items():
        item = by_id[contract_id]
        for source in contract.get("source_modules", []):
            assert f"`{source}`" in item, (contract_id, source)
        for forbidden in contract.get("forbidden_modules", []):
            assert f"`{forbidden.removeprefix('servelab.')}`" in item, (contract_id, forbidden)
