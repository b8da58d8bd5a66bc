"""Checksums of the analysis outputs, and byte-for-byte verification against them.

The `verify` target recomputes every output into a scratch directory (`analyze`) and compares each
file's SHA-256 with the checksums recorded when the results were published (`record_checksums`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servelab.analysis.figdata import FIGURES, FORMATS
from servelab.artifacts import ArtifactError, file_sha256, read_json, write_json

__all__ = ["CHECKSUMS_FORMAT", "Mismatch", "analysis_outputs", "record_checksums", "verify"]

CHECKSUMS_FORMAT = "servelab-analysis-checksums/1"
TABLES = ("table3.csv", "table4.csv", "table5.csv", "table6.csv")


def analysis_outputs(formats: Sequence[str] = FORMATS) -> list[str]:
    """Paths (relative to the results directory) of everything `analyze` writes."""
    figs = [f"figures/{name}.{fmt}" for name in FIGURES for fmt in formats]
    return [*TABLES, "numbers.json", "analysis_notes.txt", *figs]


@dataclass(frozen=True)
class Mismatch:
    path: str
    expected: str | None  # None: the file is not in the recorded checksums
    actual: str | None  # None: the file is missing

    def __str__(self) -> str:
        if self.actual is None:
            return f"{self.path}: missing (expected sha256 {self.expected})"
        if self.expected is None:
            return f"{self.path}: not in the recorded checksums (sha256 {self.actual})"
        return f"{self.path}: sha256 {self.actual} differs from recorded {self.expected}"


def record_checksums(
    results_dir: str | os.PathLike[str],
    checksums_path: str | os.PathLike[str],
    files: Sequence[str] | None = None,
) -> dict[str, str]:
    """Write the SHA-256 of each output file (relative path -> hex digest) to `checksums_path`."""
    root = Path(results_dir)
    names = list(files) if files is not None else analysis_outputs()
    digests = {}
    for name in names:
        path = root / name
        if not path.is_file():
            raise ArtifactError(f"{path}: no such file (cannot record its checksum)")
        digests[name] = file_sha256(path)
    write_json(
        checksums_path, {"format": CHECKSUMS_FORMAT, "algorithm": "sha256", "files": digests}
    )
    return digests


def verify(
    results_dir: str | os.PathLike[str], checksums_path: str | os.PathLike[str]
) -> list[Mismatch]:
    """Compare every recorded file under `results_dir` byte for byte (SHA-256); [] when all match.

    An analysis output present under `results_dir` but absent from the record is a mismatch too.
    """
    recorded = read_json(checksums_path, ("files",))
    files = recorded["files"]
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ArtifactError(f"{checksums_path}: 'files' must map paths to sha256 hex digests")
    root = Path(results_dir)
    out = []
    for name in sorted(files):
        path = root / name
        actual = file_sha256(path) if path.is_file() else None
        if actual != files[name]:
            out.append(Mismatch(name, files[name], actual))
    for name in analysis_outputs():
        if name not in files and (root / name).is_file():
            out.append(Mismatch(name, None, file_sha256(root / name)))
    return out
