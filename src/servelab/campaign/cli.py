"""`servelab campaign plan|status|redo|power`: a campaign's GPU-hours before, its runs' states during
and after, the deliberate re-measurement of chosen runs (docs/campaigns.md), the repetitions its
tests need for a target power (docs/analysis.md); and the campaign as a
Job in the cluster, `servelab campaign submit|logs|fetch` and `status --cluster`
(docs/kubernetes.md, "The campaign as a Job").

`status` reads a results folder, as it always has; `status --cluster` reads the submitted Job
instead (its state and pods: a campaign in the cluster keeps its results on its volume). After
`fetch`, plain `status` reads the copy: every run's state, as for a campaign run here."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servelab.artifacts import write_text
from servelab.campaign.plan import TARGETS, format_plan, plan_campaign
from servelab.campaign.redo import RedoError, redo_engine, redo_runs
from servelab.campaign.status import campaign_status, format_status, status_csv
from servelab.grid.config import add_config_arguments, analysis_settings, load_config
from servelab.grid.settings import AnalysisSettings

__all__ = ["register"]


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return load_config(args.config, args.configfile)


def _plan(args: argparse.Namespace) -> int:
    print(format_plan(plan_campaign(_config(args), args.target, args.results)), end="")
    return 0


def _cluster_errors(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """A command that talks to the cluster: what the cluster refused, as one line and exit 2
    (the Job's modules are imported only when such a command runs)."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        from kubernetes.client.exceptions import ApiException

        from servelab.deploy.kube_cluster import KubernetesBackendError, api_message

        try:
            return command(args)
        except KubernetesBackendError as exc:
            print(f"servelab campaign {args.campaign_command}: error: {exc}", file=sys.stderr)
        except ApiException as exc:
            print(
                f"servelab campaign {args.campaign_command}: error: the API server answered "
                f"{api_message(exc)}",
                file=sys.stderr,
            )
        return 2

    return run


@_cluster_errors
def _cluster_status(args: argparse.Namespace) -> int:
    from servelab.campaign import job

    if args.csv:
        raise ValueError("--csv is the results table's; status --cluster shows the Job")
    state = job.campaign_cluster(job.settings_of(args.configfile, args.config)).state()
    print(job.format_state(state), end="")
    return 0


def _status(args: argparse.Namespace) -> int:
    if args.cluster:
        return _cluster_status(args)
    rows = campaign_status(_config(args), args.results)
    if args.csv:
        write_text(args.csv, status_csv(rows))
    print(format_status(rows), end="")
    return 0


def _redo(args: argparse.Namespace) -> int:
    if bool(args.run_ids) == bool(args.engine):
        raise RedoError("give the runs to redo (RUN_ID ...) or --engine ENGINE: one of the two")
    if args.engine:
        engine = redo_engine(_config(args), args.results, args.engine, args.why)
        for floor in engine.floors:
            print(f"{floor.kind} of {floor.deployment}: moved to {floor.folder}")
        redone, targets = list(engine.runs), engine.targets
    else:
        redone = redo_runs(_config(args), args.results, args.run_ids, args.why)
        targets = tuple(run.target for run in redone)
    for run in redone:
        print(f"{run.run_id}: moved {', '.join(run.moved)} to {run.folder}")
    # Snakemake (since 7.7) does not re-make a missing intermediate file when the targets
    # downstream of it are present (snakemake/snakemake#1978): the runs must be named.
    print(f"targets: {' '.join(str(target) for target in targets)}")
    print(
        "the workflow measures these runs again when they are among its targets: add the "
        "targets above to the snakemake command (with yours, e.g. all)",
        file=sys.stderr,
    )
    return 0


def _power(args: argparse.Namespace) -> int:
    from servelab.analysis.power import format_power, power_csv, results_power

    rows = results_power(
        args.results,
        args.metric,
        args.effect,
        settings=AnalysisSettings.from_mapping(analysis_settings(_config(args))),
        power=args.power,
        alpha=args.alpha,
        conditions=args.condition,
    )
    if args.out:
        write_text(args.out, power_csv(rows))
    print(format_power(rows), end="")
    return 0


@_cluster_errors
def _submit(args: argparse.Namespace) -> int:
    from servelab.campaign import job

    if Path(args.config).resolve() != Path(job.BASE_CONFIG).resolve():
        raise ValueError(
            f"--config {args.config}: the Job's snakemake starts from {job.BASE_CONFIG}, as the "
            "Snakefile names it; give your configuration as --configfile"
        )
    text = job.submit(
        args.configfile,
        args.targets,
        image=args.image,
        cores=args.cores,
        replace=args.replace,
        dry_run=args.dry_run,
    )
    print(text, end="")
    return 0


@_cluster_errors
def _logs(args: argparse.Namespace) -> int:
    from servelab.campaign import job

    cluster = job.campaign_cluster(job.settings_of(args.configfile, args.config))
    if args.follow:
        name = cluster.follow(lambda text: print(text, end="", flush=True), tail_lines=args.tail)
    else:
        name, text = cluster.log(tail_lines=args.tail, pod_name=args.pod)
        print(text, end="" if text.endswith("\n") or not text else "\n")
    print(
        f"(the log of pod {name}; every invocation's whole log: .snakemake/log/ on the "
        "campaign volume)",
        file=sys.stderr,
    )
    return 0


@_cluster_errors
def _fetch(args: argparse.Namespace) -> int:
    from servelab.campaign import job

    cluster = job.campaign_cluster(job.settings_of(args.configfile, args.config))
    written = cluster.fetch(Path(args.dest), image=args.image)
    print(f"{len(written)} files of results/ written under {args.dest}")
    return 0


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """The configuration that says where the Job is (kubernetes.namespace, .campaign_job.name)
    and how to connect (kubernetes.kubeconfig, .context)."""
    add_config_arguments(parser)


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--results", default="results", help="results folder (default: results)")


def register(subparsers: Any) -> None:
    """Add `servelab campaign plan`, `status`, `redo`, `power`, `submit`, `logs` and `fetch`."""
    campaign = subparsers.add_parser(
        "campaign",
        help="plan, status, redo and power of a campaign; the campaign as a Job in a cluster",
    )
    sub = campaign.add_subparsers(dest="campaign_command", required=True)

    plan = sub.add_parser(
        "plan",
        help="the runs a target would measure, by deployment, and their GPU-hours",
        description="The runs of the target whose run.json is missing or not final, grouped by "
        "deployment: load (the conditions' duration_s), warm-ups, pauses and one start-up per "
        "deployment, summed into GPU-hours.",
    )
    _add_config_options(plan)
    plan.add_argument(
        "--target",
        default="table5",
        choices=list(TARGETS),
        help="what to plan for (default: table5; all: every run of the grid)",
    )
    plan.set_defaults(func=_plan)

    status = sub.add_parser(
        "status",
        help="every run of the grid: done, failed, discarded or missing",
        description="Every run of the grid with its state, attempts, node, wall time, reason "
        "and discards, read from the artifacts only.",
    )
    _add_config_options(status)
    status.add_argument("--csv", metavar="FILE", help="also write the table as CSV to FILE")
    status.add_argument(
        "--cluster",
        action="store_true",
        help="the submitted campaign Job instead (its state and pods; servelab campaign fetch "
        "copies its results here for the table)",
    )
    status.set_defaults(func=_status)

    redo = sub.add_parser(
        "redo",
        help="move runs' measurements aside (never deleted) so the workflow measures them again",
        description="Moves each run's measured/, attempts/ and published files to "
        "results/redone/{arm}/{engine}/{condition}/{rep}/NNN/ with a reason.json. With --engine, "
        "every run of that engine in every arm, and its deployments' unloaded floors (before and "
        "after the loaded runs) to results/redone/{floor,floor-after}/{deployment}/NNN/: the "
        "re-make of a deployment the bracketing floor refused.",
    )
    redo.add_argument(
        "run_ids", nargs="*", metavar="RUN_ID", help="{arm}/{engine}/{condition}/{rep}"
    )
    redo.add_argument(
        "--engine",
        help="instead of RUN_IDs: every run of this engine (both arms) and its floors",
    )
    redo.add_argument("--why", required=True, help="why the runs are measured again (kept)")
    _add_config_options(redo)
    redo.set_defaults(func=_redo)
    _register_power(sub)
    _register_job_commands(sub)


def _register_power(sub: Any) -> None:
    power = sub.add_parser(
        "power",
        help="repetitions for a target power, from a finished campaign's spread",
        description="Per seed-paired condition of each arm: the sample sd of the paired log "
        "ratios of METRIC over the campaign's repetitions (the analysis' own test: a two-sided "
        "paired t-test on log values), the repetitions that give the target power to detect a "
        "true ratio EFFECT, and the power at the campaign's n (noncentral t, scipy.stats.nct). "
        "Reads the run artifacts only (docs/analysis.md, Power and multiplicity).",
    )
    _add_config_options(power)
    power.add_argument(
        "--metric",
        required=True,
        help="the run metric tested: ttft_p50, ttft_p95, tpot_p50, e2e_p50 or throughput",
    )
    power.add_argument(
        "--effect",
        required=True,
        type=float,
        help="the true ratio to detect (1.25: one engine 25%% slower; 0.8 is the same size)",
    )
    power.add_argument("--power", type=float, default=0.8, help="the target power (default: 0.8)")
    power.add_argument(
        "--alpha", type=float, default=0.05, help="the test's level, two-sided (default: 0.05)"
    )
    power.add_argument(
        "--condition",
        action="append",
        metavar="ID",
        help="only this condition (repeatable; default: every seed-paired condition)",
    )
    power.add_argument("--out", metavar="FILE", help="also write the table as CSV to FILE")
    power.set_defaults(func=_power)


def _register_job_commands(sub: Any) -> None:
    """`submit`, `logs`, `fetch`: the campaign as a Job on the cluster's CPU node."""
    submit = sub.add_parser(
        "submit",
        help="run the campaign as a Job in the cluster (renders and applies its objects)",
        description="Renders the campaign Job, its ServiceAccount and RBAC, its volume and its "
        "configuration (the --configfile files, as given) and applies them; the Job's snakemake "
        "merges them over the image's config/config.yaml and makes TARGET... (default: the "
        "workflow's default target). An active Job is never replaced.",
    )
    _add_cluster_options(submit)
    submit.add_argument("targets", nargs="*", metavar="TARGET", help="snakemake targets")
    submit.add_argument(
        "--image", help="servelab's image pinned by digest (default: kubernetes.campaign_job.image)"
    )
    submit.add_argument("--cores", type=int, help="snakemake --cores (default: campaign.gpu_nodes)")
    submit.add_argument(
        "--replace",
        action="store_true",
        help="delete a finished Job of the same name first (its volume and results stay)",
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="print the objects as YAML and contact no cluster",
    )
    submit.set_defaults(func=_submit)

    logs = sub.add_parser(
        "logs",
        help="the campaign Job's snakemake log (its newest pod)",
        description="The snakemake log of the campaign Job's newest pod (or --pod), redacted.",
    )
    _add_cluster_options(logs)
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    logs.add_argument("--pod", metavar="NAME", help="this pod of the Job instead")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing as it grows")
    logs.set_defaults(func=_logs)

    fetch = sub.add_parser(
        "fetch",
        help="copy results/ of the campaign volume here",
        description="Copies results/ of the campaign volume into DEST through a helper pod that "
        "mounts it read-only (tar over the exec API, as kubectl cp); each file lands atomically, "
        "files DEST has and the volume lacks are kept. Then servelab campaign status, the "
        "analysis and the bundle read DEST.",
    )
    _add_cluster_options(fetch)
    fetch.add_argument("--dest", default="results", help="where results/ goes (default: results)")
    fetch.add_argument("--image", help="the helper pod's image if there is no Job to take it from")
    fetch.set_defaults(func=_fetch)
