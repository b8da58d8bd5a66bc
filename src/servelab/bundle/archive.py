"""One campaign in one file, verifiable elsewhere: `write_bundle` and `verify_bundle`.

A bundle is a gzip tar whose members all live under `servelab-bundle/`: `bundle.json` (what made
the results and the SHA-256 and size of every other member), `config.yaml` (the configuration as
used), `README.md` (for an evaluator), and the campaign's files at their paths relative to the
results folder (traces, rendered manifests, deployments' start-up records, every run's artifacts,
discarded and superseded measurements, tables, figures, numbers.json, analysis_notes.txt,
checksums.json). It is deterministic: members sorted by path, mtime, uid and gid zeroed, a gzip
header without time or name, and a member whose bytes equal an earlier member's (a run's
published files are its measured/ files) stored as a hard link to it, so the same results give
the same bytes.

`verify_bundle` extracts a bundle into a fresh folder, refuses it unless every member matches
bundle.json, then regenerates every table, figure, number and notes file from the bundle's run
artifacts alone, with the analysis settings the bundle records, and compares them byte for byte
with the bundle's outputs.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import json
import logging
import os
import platform
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from servelab.analysis.verify import CHECKSUMS_FORMAT, analysis_outputs
from servelab.artifacts import atomic_path, read_json
from servelab.artifacts.provenance import git_commit, servelab_version
from servelab.grid import config as grid
from servelab.grid.settings import AnalysisSettings

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_ROOT",
    "BundleError",
    "VerifyReport",
    "bundle_members",
    "verify_bundle",
    "write_bundle",
]

log = logging.getLogger("servelab.bundle.archive")
PathLike = str | os.PathLike[str]

BUNDLE_FORMAT = "servelab-bundle/1"
BUNDLE_ROOT = "servelab-bundle"
MANIFEST_NAME = "bundle.json"
CONFIG_NAME = "config.yaml"
README_NAME = "README.md"
VERIFIED_PREFIX = "verified: every output identical"
# The campaign writes run directories as `results/runs/...`; the analysis records a skipped run's
# directory as given, so regeneration must name it the same way (see `_run_dir_prefix`).
DEFAULT_RUN_DIR_PREFIX = "results"
# Files of a deployment folder that describe the engine, not the local processes that served it
# (local.json, server logs and pids are machine state, not results).
DEPLOYMENT_FILES = ("startup.log", "resolved.json", "startup.refused.log")
RUN_REQUIRED = ("run.json", "requests.parquet", "telemetry.parquet")
GZIP_LEVEL = 6  # the Parquet members are already zstd-compressed; higher levels buy little


class BundleError(ValueError):
    """A bundle cannot be written or is not intact; the message names the file."""


# --------------------------------------------------------------------------- what goes in


@dataclass(frozen=True)
class _Selection:
    files: list[str]  # paths relative to the results folder, sorted
    absent: list[str]  # expected but optional paths that do not exist
    run_dirs: list[str]
    manifests: list[str]
    restart_records: list[str]


def _walk(root: Path, rel: str) -> list[str]:
    """Every regular file under `root/rel` as a results-relative POSIX path ([] if absent)."""
    base = root / rel
    if not base.is_dir():
        return []
    return sorted(
        p.relative_to(root).as_posix()
        for p in base.rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.endswith(".tmp")
    )


def _restart_records(config: Mapping[str, Any]) -> list[str]:
    """The campaign's restart records, as the workflow declares them (kubernetes only)."""
    reps = int(config.get("restart", {}).get("repetitions", 0))
    if config["backend"] != "kubernetes" or reps == 0:
        return []
    return [
        f"restarts/{engine}/restart{k}/restart.json"
        for engine in config["engines"]
        for k in range(1, reps + 1)
    ]


def _select(root: Path, config: Mapping[str, Any]) -> _Selection:
    """The campaign's files under `root`, from its grid; a file the analysis needs must exist."""
    runs = grid.runs(config)
    required: list[str] = []
    optional: list[str] = []
    walked: list[str] = []
    run_dirs = sorted(f"runs/{run.id}" for run in runs)  # as the workflow passes them
    manifests = sorted({f"traces/{run.condition}/{run.rep}/manifest.json" for run in runs})
    restart_records = _restart_records(config)
    required += manifests + restart_records
    optional += [m.replace("manifest.json", "trace.parquet") for m in manifests]
    for run_dir in run_dirs:
        required += [f"{run_dir}/{name}" for name in RUN_REQUIRED]
        optional.append(f"{run_dir}/scrape.parquet")
        walked += _walk(root, run_dir)  # measured/, attempts/ and anything else the run kept
    blocks = sorted({f"{run.arm}/{run.engine}/{run.condition}" for run in runs})
    for block in blocks:
        optional.append(f"runs/{block}/block.json")
        walked += _walk(root, f"discarded/{block}") + _walk(root, f"superseded/{block}")
    deployments = sorted(
        {grid.deployment_for(config, r.arm, r.engine, r.condition).id for r in runs}
    )
    for dep in deployments:
        optional.append(f"manifests/{dep}.yaml")
        walked += [
            f"deployments/{dep}/{name}"
            for name in DEPLOYMENT_FILES
            if (root / "deployments" / dep / name).is_file()
        ]
        walked += _walk(root, f"deployments/{dep}/startups")
    required += [*analysis_outputs(), "checksums.json"]
    missing = [p for p in required if not (root / p).is_file()]
    if missing:
        raise BundleError(
            f"{root}: cannot bundle, {len(missing)} required file(s) missing: "
            + ", ".join(str(root / p) for p in missing[:10])
            + (" ..." if len(missing) > 10 else "")
        )
    present_optional = [p for p in optional if (root / p).is_file()]
    absent = sorted(set(optional) - set(present_optional))
    files = sorted(set(required + present_optional + walked))
    return _Selection(files, absent, run_dirs, manifests, restart_records)


def bundle_members(results_dir: PathLike, config: Mapping[str, Any]) -> list[str]:
    """The results-relative paths a bundle of `config`'s campaign would hold (besides the
    generated bundle.json, config.yaml and README.md)."""
    return _select(Path(results_dir), config).files


def _check_backends(root: Path, run_dirs: Iterable[str], backend: str) -> None:
    for run_dir in run_dirs:
        path = root / run_dir / "run.json"
        recorded = read_json(path, ("backend",))["backend"]
        if recorded != backend:
            raise BundleError(
                f"{path}: backend {recorded!r}, but the campaign's config says {backend!r}"
            )


def _run_dir_prefix(root: Path) -> str:
    """How the recorded analysis named run directories (numbers.json, skipped runs): the part
    before `runs/{run_id}`. With no skipped run the name appears nowhere, so any prefix will do."""
    numbers = read_json(root / "numbers.json", ("runs",))
    prefixes = set()
    for skipped in numbers["runs"].get("skipped_runs", []):
        run_dir = PurePosixPath(str(skipped["path"]))
        suffix = PurePosixPath("runs", str(skipped["run_id"]))
        if run_dir.parts[-len(suffix.parts) :] != suffix.parts:
            raise BundleError(
                f"{root / 'numbers.json'}: skipped run {skipped['run_id']} has path "
                f"{skipped['path']!r}, not under runs/{skipped['run_id']}"
            )
        prefixes.add(str(PurePosixPath(*run_dir.parts[: -len(suffix.parts)])))
    if len(prefixes) > 1:
        raise BundleError(f"{root / 'numbers.json'}: run directories under {sorted(prefixes)}")
    prefix = prefixes.pop() if prefixes else DEFAULT_RUN_DIR_PREFIX
    if PurePosixPath(prefix).is_absolute():
        # Regeneration elsewhere cannot reproduce an absolute path; say so now, not at verify.
        raise BundleError(
            f"{root / 'numbers.json'}: the analysis named run directories by the absolute path "
            f"{prefix!r}; analyse with a relative results path (as the workflow does) to bundle"
        )
    return prefix


def _distributions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name not in versions:
            versions[name] = dist.version
    return dict(sorted(versions.items(), key=lambda kv: kv[0].lower()))


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as plain YAML-safe values (Snakemake's config may hold its own mapping types)."""
    plain = json.loads(json.dumps(config))
    assert isinstance(plain, dict)
    return plain


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _readme(manifest: Mapping[str, Any]) -> str:
    runs = manifest["analysis"]["run_dirs"]
    lines = [
        "# servelab bundle",
        "",
        f"One servelab campaign ({manifest['backend']} backend, {len(runs)} runs), made by "
        f"servelab {manifest['servelab']['version']} (commit {manifest['servelab']['commit']}) "
        f"on Python {manifest['python']['version']}.",
        "",
        "## What is inside",
        "",
        "- `bundle.json`: format, servelab version and commit, Python and every installed "
        "distribution's version, the backend, the analysis settings and the inputs the analysis "
        "read, and the SHA-256 and size of every other member (`files`).",
        "- `config.yaml`: the campaign's configuration as used.",
        "- `traces/{condition}/{rep}/`: each trace (`trace.parquet`) and its `manifest.json`.",
        "- `manifests/`, `deployments/`: rendered manifests, each deployment's `startup.log` and "
        "`resolved.json` (and kept `startups/`).",
        "- `runs/{arm}/{engine}/{condition}/{rep}/`: every run's `requests.parquet`, "
        "`scrape.parquet`, `telemetry.parquet`, `run.json` (with the node identities), "
        "`measured/`, `attempts/`; `runs/.../block.json` per block.",
        "- `discarded/`, `superseded/`: measurements moved aside, with their reasons.",
        "- `table3.csv` .. `table6.csv`, `figures/`, `numbers.json`, `analysis_notes.txt`, "
        "`checksums.json`: the analysis outputs.",
        "",
        f"Expected files that the campaign did not have: {len(manifest['absent'])}"
        + (" (listed in bundle.json, `absent`)." if manifest["absent"] else "."),
        "",
        "## How to verify",
        "",
        "With the servelab version above installed:",
        "",
        "    servelab verify BUNDLE.tar.gz [--workdir DIR]",
        "",
        "It checks every member against bundle.json, regenerates every table, figure, number and "
        "notes file from the runs in the bundle alone with the settings recorded in bundle.json, "
        "and compares them byte for byte with the bundle's. It exits 0 and ends with "
        f"`{VERIFIED_PREFIX}` when all match; otherwise it exits 1 naming each file.",
        "",
    ]
    return "\n".join(lines)


def _tarinfo(name: str, size: int, link_to: str | None = None) -> tarfile.TarInfo:
    """A member with nothing of the machine in it; `link_to`: a hard link to that earlier member
    (chosen by content, never by the inodes on disk, so the bytes do not depend on them)."""
    info = tarfile.TarInfo(f"{BUNDLE_ROOT}/{name}")
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    if link_to is not None:
        info.type = tarfile.LNKTYPE
        info.linkname = f"{BUNDLE_ROOT}/{link_to}"
    return info


def write_bundle(results_dir: PathLike, config: Mapping[str, Any], out_path: PathLike) -> Path:
    """Write the campaign of `config` (merged and validated) found under `results_dir` as one
    deterministic gzip tar at `out_path`; BundleError names a missing or inconsistent file."""
    root = Path(results_dir)
    if not root.is_dir():
        raise BundleError(f"{root}: no such results directory")
    selection = _select(root, config)
    backend = str(config["backend"])
    _check_backends(root, selection.run_dirs, backend)
    checksums = read_json(root / "checksums.json", ("format", "files"))
    if checksums["format"] != CHECKSUMS_FORMAT:
        raise BundleError(f"{root / 'checksums.json'}: format {checksums['format']!r}")
    generated = {CONFIG_NAME: yaml.safe_dump(_plain(config), sort_keys=False).encode()}
    files: dict[str, dict[str, Any]] = {}
    for rel in selection.files:
        data = (root / rel).read_bytes()
        files[rel] = {"sha256": _sha256(data), "size": len(data)}
    manifest: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "servelab": {"version": servelab_version(), "commit": git_commit()},
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "distributions": _distributions(),
        "backend": backend,
        "analysis": {
            "settings": grid.analysis_settings(config),
            "run_dirs": selection.run_dirs,
            "run_dir_prefix": _run_dir_prefix(root),
            "manifests": selection.manifests,
            "restart_records": selection.restart_records,
            "outputs": analysis_outputs(),
        },
        "absent": selection.absent,
    }
    generated[README_NAME] = _readme(manifest).encode()
    for rel, data in generated.items():
        files[rel] = {"sha256": _sha256(data), "size": len(data)}
    manifest["files"] = dict(sorted(files.items()))
    generated[MANIFEST_NAME] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    out = Path(out_path)
    # filename="" and mtime=0 keep the gzip header free of the temporary name and the clock.
    with (
        atomic_path(out) as tmp,
        tmp.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        first_with: dict[tuple[str, int], str] = {}
        for rel in sorted([*selection.files, *generated]):
            if rel in generated:
                data = generated[rel]
                tar.addfile(_tarinfo(rel, len(data)), io.BytesIO(data))
                continue
            content = (files[rel]["sha256"], files[rel]["size"])
            if content[1] > 0 and content in first_with:
                # A run's published files are its measured/ files again: store the bytes once.
                tar.addfile(_tarinfo(rel, 0, link_to=first_with[content]))
                continue
            first_with[content] = rel
            # Stream from disk: a size that changed since hashing fails the member.
            with (root / rel).open("rb") as fh:
                tar.addfile(_tarinfo(rel, files[rel]["size"]), fh)
    log.info("bundled %d files of %s into %s", len(files) + 1, root, out)
    return out


# --------------------------------------------------------------------------- verify


@dataclass
class VerifyReport:
    """What `verify_bundle` found: the bundle's integrity, the runs analysed, the comparison."""

    bundle: Path
    workdir: Path
    members: int
    backend: str
    found: int = 0
    parsed: int = 0
    skipped: int = 0
    skipped_runs: list[str] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    kept: bool = True  # False: the work folder was temporary and is gone

    @property
    def ok(self) -> bool:
        return not self.differences

    def render(self) -> str:
        lines = [
            f"bundle {self.bundle}: {self.members} members, every one matches bundle.json",
            f"extracted and regenerated in {self.workdir}" + ("" if self.kept else " (removed)"),
            f"backend {self.backend}: runs found {self.found}, parsed {self.parsed}, "
            f"skipped {self.skipped}",
            *(f"  skipped {s}" for s in self.skipped_runs),
        ]
        if self.ok:
            lines.append(
                f"{VERIFIED_PREFIX} ({len(self.compared)} files regenerated from the bundle's "
                "runs and compared byte for byte)"
            )
        else:
            lines.append(
                f"NOT verified: {len(self.differences)} of {len(self.compared)} regenerated "
                "output(s) differ from the bundle's:"
            )
            lines += [f"  {d}" for d in self.differences]
        return "\n".join(lines) + "\n"


def _safe_member_path(bundle: Path, name: str) -> str:
    """The member's path under `servelab-bundle/`, refusing anything that could escape it."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or path.parts[:1] != (BUNDLE_ROOT,):
        raise BundleError(f"{bundle}: member {name!r} is not under {BUNDLE_ROOT}/")
    return PurePosixPath(*path.parts[1:]).as_posix()


def _extract(bundle: Path, dest: Path) -> dict[str, str]:
    """Extract every member under `dest`; returns relative path -> SHA-256 of its bytes."""
    digests: dict[str, str] = {}
    try:
        with tarfile.open(bundle, mode="r:gz") as tar:
            for member in tar:
                rel = _safe_member_path(bundle, member.name)
                if rel in digests:
                    raise BundleError(f"{bundle}: member {member.name!r} appears twice")
                target = dest / rel
                if member.islnk():
                    # Same bytes as an earlier member: copy it (already extracted and hashed).
                    linked = _safe_member_path(bundle, member.linkname)
                    if linked not in digests:
                        raise BundleError(
                            f"{bundle}: member {member.name!r} links to {member.linkname!r}, "
                            "which does not precede it"
                        )
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(dest / linked, target)
                    digests[rel] = digests[linked]
                    continue
                if not member.isfile():
                    raise BundleError(f"{bundle}: member {member.name!r} is not a regular file")
                source = tar.extractfile(member)
                assert source is not None  # a regular file always has data
                target.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                with target.open("wb") as out:
                    for block in iter(functools.partial(source.read, 1 << 20), b""):
                        digest.update(block)
                        out.write(block)
                digests[rel] = digest.hexdigest()
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BundleError(
            f"{bundle}: not a readable gzip tar, truncated or corrupt ({exc})"
        ) from exc
    return digests


def _check_members(bundle: Path, dest: Path, digests: Mapping[str, str]) -> dict[str, Any]:
    """bundle.json, after every member has been checked against it (BundleError names each)."""
    if MANIFEST_NAME not in digests:
        raise BundleError(f"{bundle}: no {BUNDLE_ROOT}/{MANIFEST_NAME} (not a servelab bundle)")
    try:
        manifest = read_json(dest / MANIFEST_NAME, ("format", "files", "analysis", "backend"))
    except ValueError as exc:
        raise BundleError(f"{bundle}: {BUNDLE_ROOT}/{MANIFEST_NAME} unreadable ({exc})") from exc
    if manifest["format"] != BUNDLE_FORMAT:
        raise BundleError(
            f"{bundle}: {BUNDLE_ROOT}/{MANIFEST_NAME} format {manifest['format']!r}, "
            f"expected {BUNDLE_FORMAT!r}"
        )
    recorded: Mapping[str, Mapping[str, Any]] = manifest["files"]
    problems = []
    for rel in sorted(recorded):
        if rel not in digests:
            problems.append(f"{BUNDLE_ROOT}/{rel}: missing from the bundle")
        elif digests[rel] != recorded[rel]["sha256"]:
            problems.append(
                f"{BUNDLE_ROOT}/{rel}: sha256 {digests[rel]} differs from bundle.json's "
                f"{recorded[rel]['sha256']}"
            )
        elif (dest / rel).stat().st_size != recorded[rel]["size"]:
            problems.append(f"{BUNDLE_ROOT}/{rel}: size differs from bundle.json's")
    problems += [
        f"{BUNDLE_ROOT}/{rel}: not listed in bundle.json"
        for rel in sorted(set(digests) - set(recorded) - {MANIFEST_NAME})
    ]
    if problems:
        raise BundleError(f"{bundle}: refused, {len(problems)} member(s): " + "; ".join(problems))
    return manifest


@contextlib.contextmanager
def _results_view(extracted: Path, scratch: Path, prefix: str) -> Any:
    """Run the analysis from a folder where `prefix` names the extracted results, so each run
    directory is named exactly as the recorded analysis named it (skipped runs carry the name)."""
    link = scratch / prefix
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(extracted.resolve(), target_is_directory=True)
    try:
        with contextlib.chdir(scratch):
            yield
    finally:
        link.unlink()


def _regenerate(manifest: Mapping[str, Any], extracted: Path, scratch: Path) -> Any:
    from servelab.analysis.pipeline import analyze  # imports matplotlib; only verify needs it

    section = manifest["analysis"]
    prefix = str(section.get("run_dir_prefix", DEFAULT_RUN_DIR_PREFIX))
    out = (scratch / "regenerated").resolve()
    with _results_view(extracted, scratch / "view", prefix):
        return analyze(
            [f"{prefix}/{d}" for d in section["run_dirs"]],
            out,
            manifests=[f"{prefix}/{m}" for m in section["manifests"]],
            restart_records=[f"{prefix}/{r}" for r in section["restart_records"]],
            settings=AnalysisSettings.from_mapping(section["settings"]),
        )


def _compare(manifest: Mapping[str, Any], extracted: Path, regenerated: Path) -> list[str]:
    outputs = list(manifest["analysis"].get("outputs") or analysis_outputs())
    differences = []
    for rel in outputs:
        ours, theirs = regenerated / rel, extracted / rel
        if not ours.is_file():
            differences.append(f"{rel}: not regenerated")
        elif not theirs.is_file():
            differences.append(f"{rel}: regenerated, but the bundle has no such file")
        elif ours.read_bytes() != theirs.read_bytes():
            differences.append(f"{rel}: the regenerated output differs from the bundle's")
    checksums = read_json(extracted / "checksums.json", ("files",))["files"]
    for rel in sorted(checksums):
        theirs = extracted / rel
        if theirs.is_file() and _sha256(theirs.read_bytes()) != checksums[rel]:
            differences.append(f"{rel}: the bundle's file differs from its checksums.json")
    return differences


def verify_bundle(bundle_path: PathLike, workdir: PathLike | None = None) -> VerifyReport:
    """Extract `bundle_path` into a fresh folder (`workdir`, which must be empty or absent, or a
    temporary one removed afterwards), refuse it unless every member matches bundle.json
    (BundleError names each file), regenerate the analysis from its runs with its recorded
    settings and compare byte for byte. Differences are in the report, not raised."""
    bundle = Path(bundle_path)
    if not bundle.is_file():
        raise BundleError(f"{bundle}: no such bundle")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="servelab-verify-")))
        else:
            work = Path(workdir)
            if work.exists() and (not work.is_dir() or any(work.iterdir())):
                raise BundleError(f"{work}: the work folder must be empty or not exist yet")
            work.mkdir(parents=True, exist_ok=True)
        extracted = work / BUNDLE_ROOT
        digests = _extract(bundle, extracted)
        manifest = _check_members(bundle, extracted, digests)
        try:
            result = _regenerate(manifest, extracted, work)
        except ValueError as exc:  # PoolingError, ArtifactError: refused exactly as runs are
            raise BundleError(f"{bundle}: the analysis refuses the bundle's runs: {exc}") from exc
        regenerated = work / "regenerated"
        numbers = read_json(regenerated / "numbers.json", ("runs",))
        report = VerifyReport(
            bundle=bundle,
            workdir=work,
            members=len(digests),
            backend=str(manifest["backend"]),
            found=result.found,
            parsed=result.parsed,
            skipped=result.skipped,
            skipped_runs=[
                f"{s['run_id']}: {s['reason']}" for s in numbers["runs"].get("skipped_runs", [])
            ],
            compared=list(manifest["analysis"].get("outputs") or analysis_outputs()),
            kept=workdir is not None,
            differences=_compare(manifest, extracted, regenerated),
        )
    return report
