"""The workflow's sim backend runs the configured platform model (servelab.sim.platform): every
run.json of a Snakemake campaign records the drift of its deployment and the noise of its run,
drawn from the config's `sim.platform`, and the two repetitions of a block differ by their noise."""

from __future__ import annotations

from campaigns import Workdir

from servelab.artifacts import read_json
from servelab.grid.settings import PlatformSettings
from servelab.sim.platform import PlatformModel


def test_every_run_of_a_campaign_carries_its_deployment_drift_and_run_noise(
    tiny_campaign: Workdir,
):
    model = PlatformModel(PlatformSettings())  # the config sets no `sim:`: the defaults
    records = sorted((tiny_campaign.path / "results" / "runs").glob("*/*/*/*/run.json"))
    assert len(records) == 4  # tiny_config: 2 engines x 2 repetitions
    noises = set()
    for path in records:
        record = read_json(path)
        platform = record["sim"]["platform"]
        deployment = record["deployment_id"]
        assert platform["enabled"] is True, path
        assert platform["drift"] == model.drift(deployment) != 1.0, path
        noise = model.noise(deployment, record["condition"], record["rep"])
        assert platform["noise"] == noise != 1.0, path
        noises.add(noise)
    assert len(noises) == 4
