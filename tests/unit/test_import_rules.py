"""The import graph of src/servelab, read from the source: no cycle between modules, and the
module rules of docs/architecture.md hold.

Every `import` and `from ... import` in a file counts, wherever it stands (module top level, inside
a function, under `if TYPE_CHECKING:`): a lazy import is still a dependency. Relative imports are
resolved; `from servelab.x import y` where `y` is a submodule counts as importing `servelab.x.y`,
otherwise as importing `servelab.x` (its `__init__.py`). Nodes are files. Importing `a.b.c` also
runs the packages `a` and `a.b`, but that is not an edge of its own: a package's `__init__` that
re-exports its submodules would otherwise form a cycle with every submodule that imports a
sibling. Imports by string (`importlib.import_module`, as servelab.cli does for its subcommands)
are not statements and are not seen.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "servelab"


@dataclass(frozen=True)
class Rule:
    """What the modules under `layer` may import from the package.

    `forbidden`: modules the layer must not reach at all, directly or through other modules (the
    client that imports a helper that imports the simulator still knows the simulator).
    `allowed`, when given: the only modules outside the layer it may import directly.
    Every entry is a module prefix: `servelab.sim` stands for `servelab.sim` and `servelab.sim.*`.
    """

    layer: str
    why: str
    forbidden: tuple[str, ...] = ()
    allowed: Mapping[str, str] = field(default_factory=dict)  # module prefix -> why it is allowed


# The module rules, as the architecture states them. A new dependency that breaks one is a design
# change: change docs/architecture.md and this table together, with the reason.
RULES: tuple[Rule, ...] = (
    Rule(
        layer="servelab.analysis",
        why="the analysis reads artifacts only: it reruns on a results folder from any backend",
        allowed={
            "servelab.artifacts": "the artifact schemas and their readers/writers: what it reads",
            "servelab.engines": "the engine registry: which engines there are and their metric "
            "names (facts that know no backend)",
            "servelab.grid.config": "the study config: the `analysis:` parameters (analysis.cli) and "
            "the run grid that analysis.synthetic writes fixtures for; it imports no backend",
            "servelab.artifacts.runrecord": "run.json's builder, so synthetic fixtures carry the fields "
            "the backends write",
        },
        forbidden=(
            "servelab.sim",
            "servelab.deploy",
            "servelab.dispatch",
            "servelab.telemetry",
            "servelab.campaign",
            "servelab.workload",
        ),
    ),
    Rule(
        layer="servelab.engines",
        why="engine facts (flags, resolution, log formats, metric names) know no backend, no "
        "client and no analysis: every backend and the analysis build on them",
        forbidden=(
            "servelab.sim",
            "servelab.deploy",
            "servelab.dispatch",
            "servelab.telemetry",
            "servelab.campaign",
            "servelab.analysis",
        ),
    ),
    Rule(
        layer="servelab.dispatch",
        why="the client talks HTTP to any OpenAI-compatible server: it knows no simulator, no "
        "backend, no campaign and no analysis",
        forbidden=("servelab.sim", "servelab.deploy", "servelab.campaign", "servelab.analysis"),
    ),
)


# ------------------------------------------------------------------------- the checker


def under(module: str, prefix: str) -> bool:
    """`module` is `prefix` or inside it (`servelab.sim` covers `servelab.sim.run`, not
    `servelab.simulator`)."""
    return module == prefix or module.startswith(prefix + ".")


def module_files(src: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of `package` under `src`, by dotted name (a package is its `__init__.py`)."""
    modules: dict[str, Path] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module `name` is, or the nearest enclosing one that exists (a missing attribute path)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of the package that `module` imports anywhere in its file."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, modules)
                if target is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package, one level up per extra dot
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in modules else _known(source, modules)
                if target is not None:
                    found.add(target)
    found.discard(module)
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    modules = module_files(src, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def _components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One shortest cycle per group of modules that import each other, as a path that ends where it
    starts (`[a, b, a]`)."""
    cycles = []
    for component in _components(graph):
        if len(component) < 2:
            continue
        members = set(component)
        start = component[0]
        parent: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth first inside the component: the shortest way back to `start`
            node = queue.popleft()
            if start in graph[node]:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                cycles.append([*reversed(path), start])
                break
            for child in sorted(graph[node]):
                if child in members and child not in parent and child != start:
                    parent[child] = node
                    queue.append(child)
    return cycles


def _path_to(
    graph: Mapping[str, Iterable[str]], start: str, targets: tuple[str, ...], layer: str
) -> list[str]:
    """The shortest import path from `start` to a module under one of `targets` ([] if none),
    not through `start`'s own `layer` (each of its modules is checked on its own)."""
    parent: dict[str, str] = {start: start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node != start and any(under(node, t) for t in targets):
            path = [node]
            while path[-1] != start:
                path.append(parent[path[-1]])
            return path[::-1]
        for child in sorted(graph.get(node, ())):
            if child not in parent and not under(child, layer):
                parent[child] = node
                queue.append(child)
    return []


def rule_breaks(graph: Mapping[str, Iterable[str]], rules: Iterable[Rule]) -> list[str]:
    """Every import that breaks a rule, as `importer -> ... -> imported (layer: why)`."""
    breaks = []
    for rule in rules:
        for module in sorted(m for m in graph if under(m, rule.layer)):
            if rule.allowed:
                for target in sorted(graph[module]):
                    if not under(target, rule.layer) and not any(
                        under(target, a) for a in rule.allowed
                    ):
                        breaks.append(f"{module} -> {target} ({rule.layer}: {rule.why})")
            path = _path_to(graph, module, rule.forbidden, rule.layer)
            if path:
                breaks.append(f"{' -> '.join(path)} ({rule.layer}: {rule.why})")
    return list(dict.fromkeys(breaks))


# ------------------------------------------------------------------------- the package


def test_the_graph_is_read_from_every_module() -> None:
    """The checker sees the package as it is (a checker that reads nothing passes everything)."""
    graph = import_graph()
    assert len(graph) > 50
    assert {"servelab.cli", "servelab.dispatch.client", "servelab.analysis.cli"} <= set(graph)
    # known edges: a submodule import, and a package import (`from servelab import __version__`)
    assert "servelab.dispatch.records" in graph["servelab.dispatch.paced"]
    assert "servelab" in graph["servelab.cli"]


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph()
    cycles = find_cycles(graph)
    groups = [c for c in _components(graph) if len(c) > 1]
    assert not cycles, "import cycles (one shortest path per group of modules):\n" + "\n".join(
        f"{' -> '.join(c)}   [group: {', '.join(g)}]" for c, g in zip(cycles, groups, strict=True)
    )


@pytest.mark.parametrize("rule", RULES, ids=[r.layer for r in RULES])
def test_module_rule(rule: Rule) -> None:
    graph = import_graph()
    assert any(under(m, rule.layer) for m in graph), f"no module under {rule.layer}"
    for prefix in (*rule.forbidden, *rule.allowed):
        assert any(under(m, prefix) for m in graph), f"{rule.layer}'s rule names {prefix}: gone"
    breaks = rule_breaks(graph, [rule])
    assert not breaks, "module rule broken:\n" + "\n".join(breaks)


# ------------------------------------------------------------------------- the checker itself


def _plant(root: Path, files: Mapping[str, str]) -> Path:
    """A fake package tree under `root/src` (relative path -> source); returns `root/src`."""
    src = root / "src"
    for relative, text in files.items():
        path = src / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return src


def test_checker_reports_a_planted_cycle_with_its_path(tmp_path: Path) -> None:
    """A cycle through a relative import, a function-level import and a TYPE_CHECKING import."""
    src = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f():\n    from .c import thing\n",
            "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
            "pkg/d.py": "import pkg.a\n",  # imports into the cycle, but is not part of it
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.a"] == {"pkg.b"}  # `from pkg import b`: the submodule, not the package
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_checker_reports_a_planted_cycle_through_a_package_init(tmp_path: Path) -> None:
    src = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.sub.x import X\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/x.py": "from .. import VERSION\nX = 1\n",  # `pkg.VERSION`: pkg's __init__
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.sub.x"] == {"pkg"}
    assert find_cycles(graph) == [["pkg", "pkg.sub.x", "pkg"]]


def test_checker_passes_a_tree_without_cycles(tmp_path: Path) -> None:
    src = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "import os\nfrom pkg.b import B\nA = B\n",
            "pkg/b.py": "B = 1\n",
        },
    )
    assert find_cycles(import_graph(src, "pkg")) == []


def test_checker_reports_a_planted_forbidden_import(tmp_path: Path) -> None:
    """A client module that imports the simulator inside a function breaks the client's rule; the
    same import from the simulator's side does not."""
    src = _plant(
        tmp_path,
        {
            "servelab/__init__.py": "",
            "servelab/sim/__init__.py": "",
            "servelab/sim/server.py": "from servelab.dispatch import client\n",
            "servelab/dispatch/__init__.py": "",
            "servelab/dispatch/client.py": "def f():\n    from servelab.sim.server import S\n",
        },
    )
    graph = import_graph(src)
    client_rule = next(r for r in RULES if r.layer == "servelab.dispatch")
    breaks = rule_breaks(graph, [client_rule])
    assert breaks == [
        f"servelab.dispatch.client -> servelab.sim.server (servelab.dispatch: {client_rule.why})"
    ]


def test_checker_reports_a_forbidden_module_reached_through_another(tmp_path: Path) -> None:
    """The client importing a helper that imports a backend knows the backend: the whole path is
    reported, once, at the client module that leaves the client package."""
    src = _plant(
        tmp_path,
        {
            "servelab/__init__.py": "",
            "servelab/helper.py": "import servelab.deploy.local\n",
            "servelab/deploy/__init__.py": "",
            "servelab/deploy/local.py": "",
            "servelab/dispatch/__init__.py": "from servelab.dispatch.run import go\n",
            "servelab/dispatch/run.py": "from servelab import helper\n",
        },
    )
    client_rule = next(r for r in RULES if r.layer == "servelab.dispatch")
    breaks = rule_breaks(import_graph(src), [client_rule])
    assert [b.split(" (")[0] for b in breaks] == [
        "servelab.dispatch.run -> servelab.helper -> servelab.deploy.local"
    ]


def test_checker_reports_an_analysis_import_outside_its_allowed_list(tmp_path: Path) -> None:
    """Allowed: its own modules and the listed ones. A module not on the list is a break; so is a
    backend reached through an allowed module."""
    src = _plant(
        tmp_path,
        {
            "servelab/__init__.py": "",
            "servelab/artifacts.py": "",
            "servelab/provenance.py": "",
            "servelab/config.py": "def f():\n    import servelab.deploy.local\n",
            "servelab/deploy/__init__.py": "",
            "servelab/deploy/local.py": "",
            "servelab/analysis/__init__.py": "",
            "servelab/analysis/tables.py": "from servelab import artifacts\nfrom . import runs\n",
            "servelab/analysis/runs.py": "from servelab.artifacts.provenance import stamp\n",
            "servelab/analysis/cli.py": "from servelab.grid.config import load_config\n",
        },
    )
    analysis_rule = next(r for r in RULES if r.layer == "servelab.analysis")
    breaks = rule_breaks(import_graph(src), [analysis_rule])
    assert [b.split(" (")[0] for b in breaks] == [
        "servelab.analysis.cli -> servelab.grid.config -> servelab.deploy.local",
        "servelab.analysis.runs -> servelab.artifacts.provenance",
    ]
