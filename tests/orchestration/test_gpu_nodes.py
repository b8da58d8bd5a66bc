"""Two GPU nodes (config campaign.gpu_nodes: 2) on the sim backend, through the real workflow: the
two deployments' blocks run side by side, each on its own virtual node, and every artifact is
the one-node campaign's except the node names."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from campaigns import Workdir, study_config, tiny_config

from servelab.grid.config import deployment_for, node_slots


def artifacts(results: Path) -> dict[str, bytes]:
    """Every file under results/ but the jobs' logs, by its path there."""
    return {
        str(p.relative_to(results)): p.read_bytes()
        for p in sorted(results.rglob("*"))
        if p.is_file() and "logs" not in p.relative_to(results).parts
    }


def without_nodes(run_json: bytes) -> dict[str, Any]:
    record = json.loads(run_json)
    record.pop("node")
    return dict(record)


def overlapping_jobs(output: str, rule: str) -> bool:
    """Snakemake's log shows a second `rule` job started before the first finished."""
    running: set[str] = set()
    for line in output.splitlines():
        if started := re.match(r"Job (\d+): run every repetition of ", line):
            running.add(started.group(1))
            if len(running) > 1:
                return True
        elif finished := re.match(rf"Finished jobid: (\d+) \(Rule: {rule}\)", line):
            running.discard(finished.group(1))
    return False


def test_two_nodes_measure_side_by_side_what_one_node_measures(
    tmp_path: Path, tiny_campaign: Workdir
) -> None:
    config = tiny_config(study_config())
    two_nodes = copy.deepcopy(config)
    two_nodes["campaign"]["gpu_nodes"] = 2
    slots = node_slots(two_nodes)
    assert sorted(slots.values()) == [0, 1]  # the tiny grid's two deployments, one a node

    # one node: the session's tiny campaign (the same grid, run to `all`, a superset of table5)
    one = tiny_campaign
    two = Workdir(tmp_path / "two", two_nodes)
    second = two.snakemake("--cores", "2", "results/table5.csv")
    assert second.returncode == 0, second.stdout + second.stderr
    assert overlapping_jobs(second.stdout + second.stderr, "run"), second.stderr

    b = artifacts(two.path / "results")
    a = {path: (one.path / "results" / path).read_bytes() for path in b}
    differ = [path for path in a if a[path] != b[path]]
    assert differ and all(path.endswith("run.json") for path in differ), differ
    for path in differ:
        assert without_nodes(a[path]) == without_nodes(b[path]), path
        arm, engine, condition = path.split("/")[1:4]
        slot = slots[deployment_for(config, arm, engine, condition).id]
        node = json.loads(b[path])["node"]
        assert node["start"]["name"] == f"sim-l4-node{slot}-0", path
        assert json.loads(a[path])["node"]["start"]["name"] == "sim-l4-node-0"


def test_a_reclaimed_node_discards_and_repeats_only_its_own_block(tmp_path: Path) -> None:
    config = tiny_config(study_config())
    config["campaign"]["gpu_nodes"] = 2
    slots = node_slots(config)
    vllm2 = "defaults/vllm/rate-0.28/rep2"
    config["campaign"]["faults"] = [{"run": vllm2, "kind": "reclaim", "at_s": 20}]
    work = Workdir(tmp_path, config)
    done = work.snakemake("--cores", "2", "results/table5.csv")
    assert done.returncode == 0, done.stdout + done.stderr
    assert overlapping_jobs(done.stdout + done.stderr, "run"), done.stderr

    discarded = tmp_path / "results" / "discarded"
    blocks = sorted(str(p.relative_to(discarded)) for p in discarded.glob("*/*/*"))
    assert blocks == ["defaults/vllm/rate-0.28"]  # the reclaimed node's block, nothing else
    vllm_node = f"node{slots[deployment_for(config, 'defaults', 'vllm', 'rate-0.28').id]}"
    reason = json.loads((discarded / blocks[0] / "001" / "reason.json").read_text())
    assert reason["interrupted_run"] == vllm2
    for engine in ("vllm", "sglang"):
        for rep in ("rep1", "rep2"):
            run = tmp_path / "results" / "runs" / "defaults" / engine / "rate-0.28" / rep
            record = json.loads((run / "run.json").read_text())
            assert record["status"] == "ok"
            block = json.loads((run.parent / "block.json").read_text())
            slot = slots[deployment_for(config, "defaults", engine, "rate-0.28").id]
            assert record["node"]["start"]["name"] == f"sim-l4-node{slot}-0"
            assert block["discarded"] == (["001"] if engine == "vllm" else [])
    # the interrupted attempt ended on the replacement of the vLLM block's own node
    interrupted = discarded / blocks[0] / "001" / "rep2" / "measured" / "run.json"
    assert json.loads(interrupted.read_text())["node"]["end"]["name"] == f"sim-l4-{vllm_node}-1"
