"""docs/architecture.md is the contract: it names every artifact and every column, and nothing in
the repository's code or documents cites a document outside the repository.

Everything checked is found by introspection (the schemas of servelab.artifacts, the file names the
code and the rules write, the keys of a run record as servelab.artifacts.runrecord builds it), so a new
column, file or run.json field fails here until the page describes it.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from servelab import artifacts
from servelab.analysis.verify import analysis_outputs
from servelab.artifacts import runrecord

REPO = Path(__file__).resolve().parents[2]
DOC_PATH = REPO / "docs" / "architecture.md"

# A bare file name in a string literal of the package: what the code reads or writes.
FILE_NAME = re.compile(r"^[A-Za-z0-9_{}.-]+\.(?:parquet|json|txt|csv|key|log|yaml|yml|png|pdf)$")
# Files the package names that are not artifacts of a run (no results/ path holds them).
NOT_ARTIFACTS = {
    "config.schema.yaml": "the configuration schema, package data",
    "tokenizer.json": "a tokenizer's own file in the Hugging Face cache",
}
# A quoted output path in a rule file; job logs are described by one pattern, not one by one.
RULE_PATH = re.compile(r'"((?:results|manifests)/[^"]+)"')


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC_PATH.read_text(encoding="utf-8")


def section(doc: str, heading: str) -> str:
    """The text of the `###` section whose heading starts with `heading`, up to the next heading."""
    match = re.search(
        rf"^#{{2,3}} {re.escape(heading)}.*?$(.*?)(?=^#{{2,3}} |\Z)", doc, re.M | re.S
    )
    assert match, f"docs/architecture.md has no section '### {heading}'"
    return match.group(1)


def table_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows by their first cell's backticked names: {name: cells}."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[name] = cells
    return rows


# ----------------------------------------------------------------------------- schemas


def schemas() -> dict[str, pa.Schema]:
    """Every pyarrow schema servelab.artifacts defines, by attribute name."""
    found = {name: value for name, value in vars(artifacts).items() if isinstance(value, pa.Schema)}
    assert found, "servelab.artifacts defines no pyarrow.Schema: the introspection is broken"
    return found


FLOAT_NAMES = {"halffloat": "float16", "float": "float32", "double": "float64"}


def doc_type(arrow_type: pa.DataType) -> str:
    """How the page spells a column type: `string`, `int32`, `list\\<float64\\>`."""
    if pa.types.is_list(arrow_type):
        return f"list\\<{doc_type(arrow_type.value_type)}\\>"
    # pyarrow prints float64 as "double"; the page uses the constructor names (pa.float64)
    return FLOAT_NAMES.get(str(arrow_type), str(arrow_type))


def test_the_schema_finder_sees_a_new_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema added to servelab.artifacts is found without being listed anywhere."""
    monkeypatch.setattr(artifacts, "EXAMPLE_SCHEMA", pa.schema([("x", pa.int8())]), raising=False)
    assert "EXAMPLE_SCHEMA" in schemas()


def test_doc_type_spells_nested_lists() -> None:
    assert doc_type(pa.list_(pa.list_(pa.int32()))) == "list\\<list\\<int32\\>\\>"
    assert doc_type(pa.bool_()) == "bool"
    assert doc_type(pa.float64()) == "float64"


@pytest.mark.parametrize("name", sorted(schemas()))
def test_every_schema_column_is_in_the_doc_with_its_type(doc: str, name: str) -> None:
    """`FOO_SCHEMA` is the file `foo.parquet`: its section lists every column, type and nullability."""
    schema = schemas()[name]
    file_name = name.removesuffix("_SCHEMA").lower() + ".parquet"
    text = section(doc, file_name)
    rows = table_rows(text)
    nullable = [f.name for f in schema if f.nullable]
    for field in schema:
        assert field.name in rows, (
            f"docs/architecture.md, section {file_name}: no table row for column "
            f"`{field.name}` of {name}"
        )
        cells = rows[field.name]
        assert cells[1] == doc_type(field.type), (
            f"docs/architecture.md, section {file_name}: column `{field.name}` has type "
            f"{cells[1]!r}, {name} says {doc_type(field.type)!r}"
        )
        if nullable:
            want = "yes" if field.nullable else "no"
            assert cells[2] == want, (
                f"docs/architecture.md, section {file_name}: column `{field.name}` null "
                f"should be {want!r}, the doc says {cells[2]!r}"
            )
    if not nullable:
        assert "every column is non-null" in text, (
            f"docs/architecture.md, section {file_name}: {name} has no nullable column; "
            "say 'every column is non-null'"
        )
    documented = set(rows) - {"column"}
    extra = sorted(documented - set(schema.names))
    assert not extra, f"docs/architecture.md, section {file_name}: columns not in {name}: {extra}"


# ----------------------------------------------------------------------------- vocabularies


# Each tuple of names in servelab.artifacts, and the section that must name every entry.
VOCABULARIES = {
    "REQUEST_STATUSES": "requests.parquet",
    "RUN_STATUSES": "Run record (run.json)",
    "RESTART_EVENTS": "Restart record (restart.json)",
    "RESTART_PHASES": "Restart record (restart.json)",
    "RUN_JSON_REQUIRED": "Run record (run.json)",
    "TELEMETRY_METRICS": "telemetry.parquet",
    "GPU_TELEMETRY_METRICS": "telemetry.parquet",
    "TRACE_MANIFEST_REQUIRED": "Trace manifest (manifest.json)",
    "ROLES": "trace.parquet",
    "RUN_FILES": "Measured, attempts and discarded runs",
}


def test_every_vocabulary_of_the_artifacts_has_a_section() -> None:
    tuples = sorted(
        name
        for name, value in vars(artifacts).items()
        if name.isupper()
        and isinstance(value, tuple)
        and value
        and all(isinstance(v, str) for v in value)
    )
    missing = [name for name in tuples if name not in VOCABULARIES]
    assert not missing, (
        f"servelab.artifacts defines {missing}: describe them in docs/architecture.md and add "
        "them to VOCABULARIES here"
    )


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_every_vocabulary_entry_is_named(doc: str, name: str) -> None:
    text = section(doc, VOCABULARIES[name])
    missing = [v for v in getattr(artifacts, name) if f"`{v}`" not in text]
    assert not missing, (
        f"docs/architecture.md, section {VOCABULARIES[name]}: {name} entries not named: {missing}"
    )


# ----------------------------------------------------------------------------- run.json


def built_run_record() -> dict[str, object]:
    """A run record as servelab.artifacts.runrecord builds it, from an empty requests table."""
    samples: dict[str, object] = {
        "arm": "defaults",
        "engine": "vllm",
        "condition": "rate-0.05",
        "rep": "rep1",
        "seed": 1,
        "trace_sha256": "0" * 64,
        "backend": "sim",
        "deployment_id": "defaults-vllm-00000000",
        "resolved_config": {"chunked_prefill": False, "chunk_size": None},
        "start_unix_s": 0.0,
        "end_unix_s": 1.0,
        "offered_load_rps": 0.3,
        "requests": artifacts.REQUESTS_SCHEMA.empty_table(),
        "success_threshold": 0.95,
        "attempt": 1,
        "node": {"start": {}, "end": {}},
    }
    params = inspect.signature(runrecord.build_run_record).parameters.values()
    needed = [p.name for p in params if p.default is inspect.Parameter.empty]
    unknown = [n for n in needed if n not in samples]
    assert not unknown, f"build_run_record needs {unknown}: give them a sample value here"
    return runrecord.build_run_record(**{n: samples[n] for n in needed})


def test_every_run_json_key_is_in_the_doc(doc: str) -> None:
    record = built_run_record()
    rows = table_rows(section(doc, "Run record (run.json)"))
    missing = sorted(set(record) - set(rows))
    assert not missing, f"docs/architecture.md, section run.json: no table row for {missing}"


def test_the_built_record_covers_the_required_fields() -> None:
    """The introspected keys are the real ones: they include everything the reader requires."""
    assert set(artifacts.RUN_JSON_REQUIRED) <= set(built_run_record())


# ----------------------------------------------------------------------------- file names


def code_file_names() -> dict[str, str]:
    """Every bare file name in a string literal of src/servelab, with the first module using it."""
    names: dict[str, str] = {}
    for path in sorted((REPO / "src" / "servelab").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and FILE_NAME.match(node.value)
            ):
                names.setdefault(node.value, str(path.relative_to(REPO)))
    return names


def rule_paths() -> dict[str, str]:
    """Every output path written in workflow/rules (job logs excepted), with its rule file."""
    paths: dict[str, str] = {}
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for found in RULE_PATH.findall(path.read_text(encoding="utf-8")):
            if not found.startswith("results/logs/"):
                paths.setdefault(found, str(path.relative_to(REPO)))
    return paths


def test_the_file_name_finders_find_the_known_artifacts() -> None:
    names, paths = code_file_names(), rule_paths()
    assert {"run.json", "scrape.parquet", "measurement.key", "reason.json"} <= set(names)
    assert "results/runs/{arm}/{engine}/{condition}/block.json" in paths


def test_every_file_the_code_names_is_in_the_doc(doc: str) -> None:
    missing = [
        f"{name} ({module})"
        for name, module in code_file_names().items()
        if name not in NOT_ARTIFACTS and f"{name}`" not in doc and f"/{name}" not in doc
    ]
    assert not missing, f"docs/architecture.md does not name these artifact files: {missing}"


def test_every_rule_output_path_is_in_the_doc(doc: str) -> None:
    missing = [f"{p} ({rule})" for p, rule in rule_paths().items() if f"`{p}" not in doc]
    assert not missing, f"docs/architecture.md does not give these output paths: {missing}"


def test_every_analysis_output_is_in_the_doc(doc: str) -> None:
    missing = []
    for output in analysis_outputs():
        name = Path(output)
        named = f"`{name.stem}`" in doc and f"{name.suffix}`" in doc
        if not (named or f"{name.name}`" in doc):
            missing.append(output)
    assert not missing, f"docs/architecture.md does not name these analysis outputs: {missing}"


# ----------------------------------------------------------------------------- self-contained

# Citations of documents that live outside the repository.
OUTSIDE_REFERENCES = (
    re.compile(r"DESIGN\.md"),
    re.compile(r"research/"),
    re.compile(r"shared folder", re.I),
    # ../shared/..., /work/shared/..., shared/fixtures; not a model path such as /shared/public/...
    re.compile(r"(?:\.\./|/work/|(?<![\w/.-]))shared/"),
    # section labels of the outside engine notes ("engines.md A2", "engines.md part D")
    re.compile(r"engines\.md,?\)? (?:[AB]\d|part [A-D]\b)"),
)
SCANNED = ("src", "workflow", "docs", "config", "tests", "benchmarks")
TEXT_SUFFIXES_EXTRA = {".log"}
TEXT_SUFFIXES = {".py", ".smk", ".md", ".rst", ".yaml", ".yml", ".j2", ".toml", ".txt", ".cfg"}


def scanned_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "Snakefile"]
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*")):
            parts = set(path.relative_to(REPO).parts)
            if any(p.endswith(".egg-info") or p == "__pycache__" for p in parts):
                continue  # build output, not the repository's text
            if path == Path(__file__).resolve():
                continue  # this file quotes the patterns it looks for
            if path.is_file() and path.suffix in TEXT_SUFFIXES | TEXT_SUFFIXES_EXTRA:
                files.append(path)
    return files


def outside_references(text: str) -> list[str]:
    return [m.group(0) for pattern in OUTSIDE_REFERENCES for m in pattern.finditer(text)]


@pytest.mark.parametrize(
    "text",
    [
        'see DESIGN.md "Workload"',
        "(research/engines.md A2)",
        "the project's shared folder",
        "/work/shared/research",
        "copied from shared/fixtures/engine-logs",
        "engines.md B2",
        "engines.md part D",
    ],
)
def test_the_scan_catches_an_outside_reference(text: str) -> None:
    assert outside_references(text), text


@pytest.mark.parametrize(
    "text",
    [
        "docs/engines.md, 'Upstream sources'",
        "a prefix shared by every request",
        "prefix-shared/suffix",
        "docs/engines.md (Metrics)",
    ],
)
def test_the_scan_lets_in_repo_text_pass(text: str) -> None:
    assert not outside_references(text), text


def test_nothing_cites_a_document_outside_the_repository() -> None:
    found = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for hit in outside_references(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {hit!r}")
    assert not found, "references to documents outside the repository:\n" + "\n".join(found)


# ----------------------------------------------------------------------------- configuration

SCHEMA_PATH = REPO / "src" / "servelab" / "grid" / "config.schema.yaml"


def config_keys(
    node: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every key the config schema defines, as a path of names (engine and arm names are `*`)."""
    if "$ref" in node:
        node = defs[node["$ref"].removeprefix("#/$defs/")]
    keys: list[tuple[str, ...]] = []
    for name, child in node.get("properties", {}).items():
        keys.append((*path, name))
        keys.extend(config_keys(child, defs, (*path, name)))
    for child in node.get("patternProperties", {}).values():
        keys.extend(config_keys(child, defs, (*path, "*")))
    if isinstance(node.get("items"), dict):
        keys.extend(config_keys(node["items"], defs, path))
    return keys


def reference_sections(doc: str) -> dict[str, str]:
    """The configuration reference's subsections, by each top-level key their heading names."""
    reference = doc[doc.index("## Configuration reference") :]
    parts = re.split(r"^### (.+)$", reference, flags=re.M)
    sections: dict[str, str] = {}
    for heading, text in zip(parts[1::2], parts[2::2], strict=True):
        for name in heading.split(","):
            sections[name.strip()] = text
    return sections


def test_the_key_walk_reaches_nested_and_referenced_keys() -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
    keys = set(config_keys(schema, schema["$defs"]))
    assert ("kubernetes", "timeouts", "ready_s") in keys  # nested mapping
    assert ("conditions", "rate") in keys  # list items
    assert ("arms", "*", "engines", "*", "expect", "chunk_size") in keys  # pattern and $ref


def test_every_config_key_is_in_the_reference(doc: str) -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
    sections = reference_sections(doc)
    missing = []
    for key in config_keys(schema, schema["$defs"]):
        where = "Top level" if len(key) == 1 else key[0]
        text = sections.get(where, "")
        # `workers`, `dispatch.workers`, `.size` (after `model_volume.claim_name`), or a mapping
        # named by its keys' paths (`timeouts.ready_s`)
        if not re.search(rf"`(?:[^`\s]*\.)?{re.escape(key[-1])}(?:\.[^`\s]*)?`", text):
            missing.append(".".join(key))
    assert not missing, (
        "docs/architecture.md, Configuration reference: keys of config.schema.yaml not "
        f"described: {missing}"
    )
