"""servelab.bundle.archive: a campaign's bundle is deterministic, verifies elsewhere, and refuses damage."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from servelab.analysis import analyze, record_checksums
from servelab.analysis.synthetic import write_synthetic_grid
from servelab.bundle.archive import (
    BUNDLE_ROOT,
    VERIFIED_PREFIX,
    BundleError,
    verify_bundle,
    write_bundle,
)
from servelab.cli import main
from servelab.grid.config import deployment_for, load_config, runs

REPO = Path(__file__).resolve().parents[2]
FAILED_RUN = "matched/sglang/rate-0.12/rep2"
REQUESTS = f"{BUNDLE_ROOT}/runs/defaults/vllm/rate-0.28/rep1/requests.parquet"


def _config() -> dict:
    return load_config(REPO / "config" / "config.yaml", [REPO / "config" / "test.yaml"])


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A small campaign's results (the test grid, synthetic runs, one failed), analysed as the
    workflow does it: from the campaign folder, with results/ given as a relative path."""
    base = tmp_path_factory.mktemp("campaign")
    cfg = _config()
    with contextlib.chdir(base):
        run_dirs, manifests = write_synthetic_grid(
            "results", cfg, duration_scale=0.05, statuses={FAILED_RUN: "failed"}
        )
        analyze(run_dirs, "results", manifests=manifests)
        record_checksums("results", "results/checksums.json")
    results = base / "results"
    first = runs(cfg)[0]
    deployment = deployment_for(cfg, first.arm, first.engine, first.condition).id
    dep_dir = results / "deployments" / deployment
    dep_dir.mkdir(parents=True)
    (dep_dir / "startup.log").write_text("engine started\n")
    (dep_dir / "resolved.json").write_text("{}\n")
    (dep_dir / "local.json").write_text('{"pid": 4242}\n')  # machine state: never bundled
    (results / "deployments" / "_prometheus" / "data").mkdir(parents=True)
    (results / "deployments" / "_prometheus" / "data" / "chunk").write_bytes(b"tsdb")
    (results / "traces" / first.condition / first.rep / "trace.parquet").write_bytes(b"trace")
    # A published run file is a hard link to measured/: the bundle must hold bytes, not links.
    run_dir = results / "runs" / first.id
    (run_dir / "measured").mkdir()
    os.link(run_dir / "run.json", run_dir / "measured" / "run.json")
    discarded = results / "discarded" / first.arm / first.engine / first.condition / "001"
    discarded.mkdir(parents=True)
    (discarded / "REASON.txt").write_text("node reclaimed\n")
    (results / "logs" / "runs").mkdir(parents=True)
    (results / "logs" / "runs" / "x.log").write_text("snakemake log\n")
    bundle = base / "campaign.tar.gz"
    write_bundle(results, cfg, bundle)
    return {"base": base, "results": results, "config": cfg, "bundle": bundle, "first": first}


def _members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]


def _repack(source: Path, target: Path, change: Callable[[dict[str, bytes]], None]) -> Path:
    members = _members(source)
    change(members)
    with tarfile.open(target, "w:gz") as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            tar.addfile(info, io.BytesIO(members[name]))
    return target


def _manifest(members: dict[str, bytes]) -> dict:
    return json.loads(members[f"{BUNDLE_ROOT}/bundle.json"])


def test_bundle_holds_the_campaign_and_nothing_of_the_machine(campaign: dict) -> None:
    members = _members(campaign["bundle"])
    names = {n.removeprefix(f"{BUNDLE_ROOT}/") for n in members}
    first = campaign["first"]
    assert all(n.startswith(f"{BUNDLE_ROOT}/") for n in members)
    assert {"bundle.json", "config.yaml", "README.md", "checksums.json", "numbers.json"} <= names
    assert f"runs/{first.id}/measured/run.json" in names
    assert f"traces/{first.condition}/{first.rep}/trace.parquet" in names
    assert f"discarded/{first.arm}/{first.engine}/{first.condition}/001/REASON.txt" in names
    assert not [n for n in names if "local.json" in n or "_prometheus" in n or "logs/" in n]
    with tarfile.open(campaign["bundle"], "r:gz") as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0, 0, "", "")}
    by_name = {i.name: i for i in infos}
    published = by_name[f"{BUNDLE_ROOT}/runs/{first.id}/run.json"]
    assert published.islnk()  # stored once: a link to the same bytes under measured/
    assert published.linkname == f"{BUNDLE_ROOT}/runs/{first.id}/measured/run.json"
    assert by_name[published.linkname].isfile()
    assert by_name[f"{BUNDLE_ROOT}/bundle.json"].isfile()
    manifest = _manifest(members)
    assert set(manifest["files"]) == names - {"bundle.json"}
    for name, entry in manifest["files"].items():
        data = members[f"{BUNDLE_ROOT}/{name}"]
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    assert manifest["backend"] == "sim"
    assert manifest["analysis"]["settings"]["engines"] == ["vllm", "sglang"]
    assert manifest["analysis"]["run_dir_prefix"] == "results"
    assert "pyarrow" in {n.lower() for n in manifest["distributions"]}
    assert yaml.safe_load(members[f"{BUNDLE_ROOT}/config.yaml"]) == campaign["config"]


def test_bundling_twice_gives_the_same_bytes(campaign: dict, tmp_path: Path) -> None:
    again = write_bundle(campaign["results"], campaign["config"], tmp_path / "again.tar.gz")
    assert again.read_bytes() == campaign["bundle"].read_bytes()


def test_verify_elsewhere_regenerates_every_output_identically(
    campaign: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "elsewhere"
    code = main(["verify", str(campaign["bundle"]), "--workdir", str(workdir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[-1].startswith(VERIFIED_PREFIX)
    assert f"skipped {FAILED_RUN}" in out
    n_runs = len(runs(campaign["config"]))
    assert f"runs found {n_runs}, parsed {n_runs - 1}, skipped 1" in out
    regenerated = workdir / "regenerated" / "numbers.json"
    assert regenerated.read_bytes() == (campaign["results"] / "numbers.json").read_bytes()


def test_a_flipped_byte_in_a_run_is_refused_naming_the_file(campaign: dict, tmp_path: Path) -> None:
    def flip(members: dict[str, bytes]) -> None:
        data = bytearray(members[REQUESTS])
        data[len(data) // 2] ^= 0xFF
        members[REQUESTS] = bytes(data)

    bad = _repack(campaign["bundle"], tmp_path / "flipped.tar.gz", flip)
    with pytest.raises(BundleError, match=r"runs/defaults/vllm/rate-0\.28/rep1/requests\.parquet"):
        verify_bundle(bad, tmp_path / "work")


def test_a_removed_run_is_named(campaign: dict, tmp_path: Path) -> None:
    def remove(members: dict[str, bytes]) -> None:
        for name in [n for n in members if "/runs/defaults/vllm/rate-0.28/rep1/" in n]:
            del members[name]

    bad = _repack(campaign["bundle"], tmp_path / "removed.tar.gz", remove)
    with pytest.raises(BundleError, match=r"rate-0\.28/rep1/run\.json: missing"):
        verify_bundle(bad)


def test_a_truncated_bundle_is_named(campaign: dict, tmp_path: Path) -> None:
    data = campaign["bundle"].read_bytes()
    bad = tmp_path / "truncated.tar.gz"
    bad.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(BundleError, match=r"truncated\.tar\.gz: not a readable gzip tar"):
        verify_bundle(bad)
    not_gzip = tmp_path / "plain.tar.gz"
    not_gzip.write_bytes(b"not a bundle at all")
    assert main(["verify", str(not_gzip)]) == 1


def test_a_tampered_output_with_its_hash_updated_is_found_by_regeneration(
    campaign: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"{BUNDLE_ROOT}/table5.csv"

    def tamper(members: dict[str, bytes]) -> None:
        members[table] = members[table].replace(b",", b";", 1)
        manifest = _manifest(members)
        manifest["files"]["table5.csv"] = {
            "sha256": hashlib.sha256(members[table]).hexdigest(),
            "size": len(members[table]),
        }
        members[f"{BUNDLE_ROOT}/bundle.json"] = json.dumps(manifest).encode()

    bad = _repack(campaign["bundle"], tmp_path / "tampered.tar.gz", tamper)
    assert main(["verify", str(bad)]) == 1
    out = capsys.readouterr().out
    assert VERIFIED_PREFIX not in out
    named = [line.strip() for line in out.splitlines() if line.startswith("  table")]
    assert named == [
        "table5.csv: the regenerated output differs from the bundle's",
        "table5.csv: the bundle's file differs from its checksums.json",
    ]


def test_bundling_refuses_a_campaign_with_a_missing_run(campaign: dict, tmp_path: Path) -> None:
    cfg = dict(campaign["config"])
    cfg["repetitions"] = 3  # a grid with runs the results do not hold
    with pytest.raises(BundleError, match=r"rep3/run\.json"):
        write_bundle(campaign["results"], cfg, tmp_path / "x.tar.gz")


def test_verify_refuses_a_used_workdir(campaign: dict, tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    with pytest.raises(BundleError, match="must be empty"):
        verify_bundle(campaign["bundle"], tmp_path / "used")
    assert gzip.decompress(campaign["bundle"].read_bytes())  # the bundle itself is intact


def test_a_bundle_mixing_backends_is_refused_as_the_runs_are(
    campaign: dict, tmp_path: Path
) -> None:
    run_json = f"{BUNDLE_ROOT}/runs/defaults/vllm/rate-0.28/rep1/run.json"

    def relabel(members: dict[str, bytes]) -> None:
        record = json.loads(members[run_json])
        record["backend"] = "local"
        members[run_json] = json.dumps(record).encode()
        manifest = _manifest(members)
        manifest["files"]["runs/defaults/vllm/rate-0.28/rep1/run.json"] = {
            "sha256": hashlib.sha256(members[run_json]).hexdigest(),
            "size": len(members[run_json]),
        }
        members[f"{BUNDLE_ROOT}/bundle.json"] = json.dumps(manifest).encode()

    bad = _repack(campaign["bundle"], tmp_path / "mixed.tar.gz", relabel)
    with pytest.raises(BundleError, match=r"mixed\.tar\.gz: the analysis refuses .*backends"):
        verify_bundle(bad)


def test_the_cli_bundles_the_same_bytes_from_a_config_file(
    campaign: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "merged.yaml"
    config_file.write_text(yaml.safe_dump(campaign["config"], sort_keys=False))  # as used
    out = tmp_path / "cli.tar.gz"
    args = ["bundle", "--results", str(campaign["results"]), "--config", str(config_file)]
    assert main([*args, "--out", str(out)]) == 0
    assert "bundle written" in capsys.readouterr().out
    assert out.read_bytes() == campaign["bundle"].read_bytes()
