"""Configuration: validation (schema + cross-references) and expansion of the experiment grid.

`validate_config` is called by the Snakefile at parse time and by every CLI entry point, so an
invalid value stops everything before any job runs, with an error naming the offending key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, cast

import jsonschema
import yaml

from servelab.engines.registry import (
    UnsupportedRelease,
    check_release,
    engine_names,
    engine_specs,
)
from servelab.engines.startup_log import startup_log_flags
from servelab.grid.settings import (
    STUDY_TABLE_CONDITIONS,
    AnalysisSettings,
    ConfigError,
    CostSettings,
    DispatchSettings,
    RequestSlo,
)
from servelab.grid.topology import graph_topologies, mean_requests_per_graph

__all__ = [
    "ARMS",
    "LOCAL_CPU_ENGINES",
    "OPTIONAL_EXPECTATIONS",
    "STUDY_TABLE_CONDITIONS",
    "Condition",
    "ConfigError",
    "Deployment",
    "FloorBlock",
    "FloorShape",
    "Run",
    "TraceSource",
    "add_config_arguments",
    "analysis_settings",
    "condition_id",
    "conditions",
    "config_text",
    "deployments",
    "drop_removed_engines",
    "floor_blocks",
    "floor_bracket_band",
    "floor_bracket_max_noise",
    "floor_extra_shapes",
    "floor_idle_gaps",
    "floor_run_config",
    "floor_settings",
    "gpu_nodes",
    "load_config",
    "local_serves_real",
    "node_slot",
    "node_slots",
    "node_usd_per_hour",
    "prepare_config",
    "read_config_file",
    "runs",
    "trace_seed",
    "validate_config",
]

ARMS = ("defaults", "matched")
# The optional keys of an arm's engine that an overlay removes by setting them to null.
REMOVABLE_ARM_KEYS = ("flags_by_condition", "skip_conditions")
# The arm expectations checked only when given (`expect:` beside chunked_prefill and chunk_size).
OPTIONAL_EXPECTATIONS = ("schedule_policy", "kv_capacity_tokens", "kv_capacity_tolerance")
SWEEP_PARAMETER = {"rate": "rate", "sharing": "sharing", "length": "prompt_tokens"}


@dataclass(frozen=True)
class TraceSource:
    """An imported trace a condition replays (config `conditions[].trace`; docs/workload.md,
    "Imported traces"): its format, its file, the source time the replay starts at, and the
    longest request (prompt + output tokens) it keeps (None: every request)."""

    format: str
    path: str
    start_s: float = 0.0
    max_request_tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Condition:
    """One condition of the grid. With `trace`, its requests come from an imported trace replayed
    at `rate` requests per second (each request its own one-request graph) for `duration_s`;
    `sharing` and `prompt_tokens` are then unused (0.0 and 0): every request has its own length
    and its sharing is the trace's."""

    id: str
    sweep: str
    rate: float
    sharing: float
    prompt_tokens: int
    duration_s: float
    trace: TraceSource | None = None


@dataclass(frozen=True)
class Deployment:
    """One engine brought up with one set of flags: deployed once per campaign."""

    arm: str
    engine: str
    flags: tuple[str, ...]
    expect_chunked_prefill: bool
    expect_chunk_size: int | None
    # Expected only when the arm says so (`expect: {schedule_policy: ..., kv_capacity_tokens: ...}`,
    # docs/ablations.md); None: not checked, and absent from the deployment's record.
    expect_schedule_policy: str | None = None
    expect_kv_capacity_tokens: int | None = None
    expect_kv_capacity_tolerance: float | None = None

    @property
    def id(self) -> str:
        digest = hashlib.sha256("\0".join(self.flags).encode()).hexdigest()[:8]
        # A Kubernetes object is named by it (a DNS-1035 label): vllm_v1 -> vllm-v1.
        return f"{self.arm}-{self.engine.replace('_', '-')}-{digest}"


@dataclass(frozen=True)
class Run:
    arm: str
    engine: str
    condition: str
    rep: str

    @property
    def id(self) -> str:
        return f"{self.arm}/{self.engine}/{self.condition}/{self.rep}"


def condition_id(sweep: str, value: float | int) -> str:
    """`rate-0.05`, `sharing-0.90`, `length-8192`: two decimals for rates and sharing ratios."""
    if sweep == "length":
        return f"length-{int(value)}"
    return f"{sweep}-{float(value):.2f}"


# libyaml's loader where PyYAML was built with it: the schema alone takes 0.2 s in pure Python, at
# every Snakefile parse and every command.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# The schema file spells the study's engines in its engine-keyed objects; validation puts the
# registry's engines in their place, so a registered engine is accepted without a schema edit.
_STUDY_ENGINES_PATTERN = "^(vllm|sglang)$"


@cache
def _schema_file() -> dict[str, Any]:
    text = (
        resources.files("servelab.grid").joinpath("config.schema.yaml").read_text(encoding="utf-8")
    )
    return cast("dict[str, Any]", yaml.load(text, Loader=_YAML_LOADER))


def _with_engines(node: Any, pattern: str) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "patternProperties" and _STUDY_ENGINES_PATTERN in value:
                value = {
                    (pattern if k == _STUDY_ENGINES_PATTERN else k): v for k, v in value.items()
                }
            out[key] = _with_engines(value, pattern)
        return out
    if isinstance(node, list):
        return [_with_engines(item, pattern) for item in node]
    return node


def _schema() -> dict[str, Any]:
    """The config schema, its engine-keyed objects accepting exactly the registered engines."""
    pattern = "^(" + "|".join(re.escape(name) for name in engine_names()) + ")$"
    return cast("dict[str, Any]", _with_engines(_schema_file(), pattern))


def _key_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validate_config(config: Mapping[str, Any]) -> None:
    """Raise ConfigError naming every bad key (schema, then cross-references)."""
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = []
        for err in errors:
            key = _key_path(err.absolute_path)
            if err.validator == "additionalProperties" and err.validator_value is False:
                extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
                lines.append(f"config key {key}: unknown key(s) {', '.join(map(repr, extra))}")
            elif err.validator == "required":
                lines.append(f"config key {key}: {err.message}")
            else:
                lines.append(f"config key {key}: {err.message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    _check_references(config)


def _check_references(config: Mapping[str, Any]) -> None:
    """Raise ConfigError naming every cross-reference the schema cannot check: each named check
    below adds its problems, in this order."""
    seen = _condition_indices(config)
    problems = [
        *_check_conditions(config),
        *_check_arms(config, seen),
        *_check_client(config),
        *_check_engines(config),
        *_check_floor_engines(config),
        *_check_floor_bracket(config),
        *_check_table_conditions(config, seen),
        *_check_simulated_needs_preset(config),
    ]
    if config["backend"] == "kubernetes":
        problems += _check_kubernetes(config)
    if config["backend"] == "sim":
        problems += _check_sim(config)
    problems += _check_capacity(config)
    problems += _check_tool_delay(config)
    problems += _check_topologies(config)
    problems += _check_gpu_nodes(config)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _condition_indices(config: Mapping[str, Any]) -> dict[str, int]:
    """Each condition id and the index of its last definition under `conditions`."""
    return {
        condition_id(cond["sweep"], cond[SWEEP_PARAMETER[cond["sweep"]]]): i
        for i, cond in enumerate(config["conditions"])
    }


def _check_conditions(config: Mapping[str, Any]) -> list[str]:
    """Condition ids are unique, and each condition's σ leaves at least one unique suffix token; a
    condition replaying an imported trace is a rate condition and has no σ or L of its own."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, cond in enumerate(config["conditions"]):
        cid = condition_id(cond["sweep"], cond[SWEEP_PARAMETER[cond["sweep"]]])
        if cid in seen:
            problems.append(
                f"config key conditions[{i}]: duplicates condition {cid} (conditions[{seen[cid]}])"
            )
        seen[cid] = i
        if "trace" in cond:  # a rate condition (the schema): its rate is the replay's
            problems += [
                f"config key conditions[{i}].{key}: a condition replaying a trace takes its "
                "prompts from the trace; remove this key"
                for key in ("sharing", "prompt_tokens")
                if key in cond
            ]
            continue
        sharing, length = cond["sharing"], cond["prompt_tokens"]
        if length - round(sharing * length) < 1:
            problems.append(
                f"config key conditions[{i}].sharing: leaves no unique suffix at L={length}"
            )
    return problems


def _check_arms(config: Mapping[str, Any], seen: Mapping[str, int]) -> list[str]:
    """Every condition an arm names exists, and every engine under an arm is defined under
    `engines`."""
    problems: list[str] = []
    for arm, spec in config["arms"].items():
        listed = spec["conditions"]
        if listed != "all":
            problems += [
                f"config key arms.{arm}.conditions[{j}]: unknown condition {cid!r}"
                for j, cid in enumerate(listed)
                if cid not in seen
            ]
        for engine, espec in spec["engines"].items():
            if engine not in config["engines"]:
                problems.append(
                    f"config key arms.{arm}.engines.{engine}: engine not defined under engines"
                )
            problems += [
                f"config key arms.{arm}.engines.{engine}.{key}: unknown condition {cid!r}"
                for key in ("flags_by_condition", "skip_conditions")
                for cid in espec.get(key, [])
                if cid not in seen
            ]
    return problems


def _check_client(config: Mapping[str, Any]) -> list[str]:
    """The paced client speaks plain http only: an https engine URL needs the httpx client."""
    kube = config.get("kubernetes") or {}
    client = config["dispatch"].get("client", DispatchSettings.client)
    if str(kube.get("engine_url", "")).startswith("https://") and client == "paced":
        return [
            "config key dispatch.client: 'paced' speaks plain http only, but "
            "kubernetes.engine_url is https; set dispatch.client: httpx"
        ]
    return []


def _check_engines(config: Mapping[str, Any]) -> list[str]:
    """Each engine's release is one its family implements, and there are at most two engines."""
    problems: list[str] = []
    engines = list(config["engines"])
    for engine in engines:
        try:
            check_release(engine, str(config["engines"][engine]["version"]))
        except UnsupportedRelease as exc:
            problems.append(f"config key engines.{engine}.version: {exc}")
    if len(engines) > 2:
        problems.append(
            f"config key engines: the analysis compares two engines (or one engine's two arms), "
            f"got {len(engines)}: {', '.join(engines)}"
        )
    return problems


def _check_floor_engines(config: Mapping[str, Any]) -> list[str]:
    """Every engine `floor.warmup_requests_by_engine` and `floor.warmup_spacing_s_by_engine`
    name is one of config `engines`."""
    floor = config.get("floor") or {}
    return [
        f"config key floor.{key}.{engine}: not an engine of config engines "
        f"({', '.join(config['engines'])})"
        for key in ("warmup_requests_by_engine", "warmup_spacing_s_by_engine")
        for engine in floor.get(key) or {}
        if engine not in config["engines"]
    ]


def _check_floor_bracket(config: Mapping[str, Any]) -> list[str]:
    """A quiet-floor bar (`floor.bracket.max_noise`) needs repeated floors: the floor's noise is
    the spread of its repetitions."""
    if floor_bracket_max_noise(config) is None or floor_settings(config)["repetitions"] >= 2:
        return []
    return [
        "config key floor.bracket.max_noise: the floor's noise is the spread of repeated "
        "floors, and floor.repetitions is 1 (set it to 2 or more, or max_noise to null)"
    ]


def _check_table_conditions(config: Mapping[str, Any], seen: Mapping[str, int]) -> list[str]:
    """Every condition `analysis.table_conditions` names exists."""
    return [
        f"config key analysis.table_conditions[{j}]: unknown condition {cid!r}"
        for j, cid in enumerate(config["analysis"].get("table_conditions", []))
        if cid not in seen
    ]


def _simulated_engines() -> list[str]:
    """The engines the simulator imitates: those whose spec prints a start-up log."""
    return [s.name for s in engine_specs() if s.render_startup_log is not None]


def _check_simulated_needs_preset(config: Mapping[str, Any]) -> list[str]:
    """A simulated engine that runs (on the config's backend) needs the model's cost preset."""
    simulated = _simulated_engines()
    run_simulated = [e for e in config["engines"] if e in simulated and _runs_simulated(config, e)]
    if "preset" not in config["model"] and run_simulated:
        return [
            "config key model.preset: required when a simulated engine runs "
            f"({', '.join(run_simulated)})"
        ]
    return []


def _check_kubernetes(config: Mapping[str, Any]) -> list[str]:
    """On the kubernetes backend: no arm's flags need a start-up probe (only the local backend
    starts one), and every engine has an image pinned by digest."""
    problems: list[str] = []
    for arm, spec in config["arms"].items():
        for engine, espec in spec["engines"].items():
            if engine not in config["engines"] or not espec:
                continue
            flags = [*config["engines"][engine]["flags"], *espec.get("flags", [])]
            try:
                probed = startup_log_flags(engine, flags) != flags
            except ValueError:  # a malformed flag: refused with its own message elsewhere
                probed = False
            if probed:
                # only the local backend starts a start-up probe (docs/llamacpp.md)
                problems.append(
                    f"config key arms.{arm}.engines.{engine}.flags: on the kubernetes backend "
                    f"the gate reads the measured pod's own start-up log, where {engine} "
                    "shows its batch size only at --log-verbosity=4, a level that slows every "
                    "task as the server's prompt cache grows "
                    "(docs/benchmarks/llamacpp-trace-cost.md); add --log-verbosity=4 to "
                    "accept that cost, or run it on the local backend, which confirms it "
                    "from a start-up probe"
                )
    problems += [
        f"config key engines.{engine}.image: the kubernetes backend needs an image pinned by digest"
        for engine in config["engines"]
        if "image" not in config["engines"][engine]
    ]
    return problems


def _check_sim(config: Mapping[str, Any]) -> list[str]:
    """On the sim backend every engine is simulated, on a platform the simulator has for it (the
    CPU platform needs the engine's fitted step time; llama.cpp runs on the CPU platform only)."""
    problems: list[str] = []
    simulated = _simulated_engines()
    for engine in config["engines"]:
        if engine not in simulated:
            problems.append(
                f"config key engines.{engine}: the sim backend has no simulated {engine} "
                f"(simulated: {', '.join(simulated)}); run it with backend: local"
            )
        elif config["gpu"]["name"] == "CPU" and engine not in (
            config["gpu"].get("step_cost") or {}
        ):
            problems.append(
                f"config key gpu.step_cost.{engine}: the simulator's CPU platform needs the "
                f"engine's fitted step time (the cpu_platform rule fits it from the floor: "
                "docs/simulator.md, 'Against the real engines')"
            )
        elif engine == "llamacpp" and config["gpu"]["name"] != "CPU":
            problems.append(
                "config key engines.llamacpp: the sim backend simulates llama.cpp on the CPU "
                "platform only (gpu.name: CPU with gpu.step_cost.llamacpp): llama.cpp has no "
                "GPU cost model"
            )
    return problems


def _check_capacity(config: Mapping[str, Any]) -> list[str]:
    """`capacity.bracket` is increasing and the capacity shapes' names are unique."""
    problems: list[str] = []
    capacity_section = config.get("capacity") or {}
    bracket = capacity_section.get("bracket")
    if bracket and bracket[0] >= bracket[1]:
        problems.append("config key capacity.bracket: the low rate must be below the high one")
    names = [s["name"] for s in capacity_section.get("shapes", [])]
    if len(names) != len(set(names)):
        problems.append("config key capacity.shapes: shape names must be unique")
    return problems


def _check_tool_delay(config: Mapping[str, Any]) -> list[str]:
    """The tool delay's truncation bounds are ordered."""
    td = config["workload"]["tool_delay"]
    if td["min_s"] >= td["max_s"]:
        return ["config key workload.tool_delay.min_s: must be below max_s"]
    return []


def _check_topologies(config: Mapping[str, Any]) -> list[str]:
    """`workload.topologies`: each entry has the one size key its shape takes (servelab.grid.topology)."""
    try:
        graph_topologies(config["workload"])
    except ConfigError as exc:
        return [str(exc)]
    return []


def _check_gpu_nodes(config: Mapping[str, Any]) -> list[str]:
    """Several GPU nodes on the local backend run their servers side by side on this machine: not
    on pinned cores, where they would measure each other (servelab.deploy.machine_load)."""
    pinned = (config.get("local") or {}).get("engine_cpus")
    if config["backend"] == "local" and gpu_nodes(config) > 1 and pinned:
        return [
            f"config key campaign.gpu_nodes: {gpu_nodes(config)} nodes on the local backend "
            f"would share the pinned cores local.engine_cpus {list(pinned)}; use one node, or "
            "no pinning"
        ]
    return []


# The Python engines the local backend runs for real on the CPU platform (gpu.name CPU), each from
# an environment of its own (servelab.deploy.local.CPU_ENGINES holds how).
LOCAL_CPU_ENGINES = ("vllm_v1", "sglang_v05")


def local_serves_real(engine: str, gpu_name: str) -> bool:
    """Whether the local backend runs the engine's real server: llama.cpp always; vLLM V1 and
    SGLang 0.5 on the CPU platform; otherwise the simulator's imitation of the engine. (Config
    validation asks it too: an engine the local backend simulates needs the model's preset.)"""
    return engine == "llamacpp" or (engine in LOCAL_CPU_ENGINES and gpu_name.lower() == "cpu")


def _runs_simulated(config: Mapping[str, Any], engine: str) -> bool:
    """Whether `engine` runs as the simulator's imitation on the config's backend: always on sim;
    on local unless the local backend serves the real engine (llama.cpp always, vLLM V1 and
    SGLang 0.5 on the CPU platform: local_serves_real); never on
    kubernetes."""
    if config["backend"] == "sim":
        return True
    if config["backend"] != "local":
        return False
    return not local_serves_real(engine, str(config["gpu"]["name"]))


def drop_removed_engines(config: dict[str, Any]) -> dict[str, Any]:
    """Remove every engine set to null, under `engines:` and each arm's `engines:`, and an arm
    engine's `flags_by_condition` or `skip_conditions` set to null (in place).

    A `--configfile` laid over config/config.yaml cannot delete a key, since Snakemake merges
    mappings, so a campaign of other engines names the study's as `vllm: null` (config/llamacpp.yaml),
    and a grid without the study's 8,192-token condition drops SGLang's flags for it with
    `flags_by_condition: null` (config/ablations/matched-sharing.yaml).
    """
    for section in [config.get("engines"), *[a.get("engines") for a in _arm_specs(config)]]:
        if isinstance(section, dict):
            for name in [n for n, value in section.items() if value is None]:
                del section[name]
    for arm in _arm_specs(config):
        engines = arm.get("engines")
        for espec in engines.values() if isinstance(engines, dict) else ():
            if isinstance(espec, dict):
                for key in REMOVABLE_ARM_KEYS:
                    if key in espec and espec[key] is None:
                        del espec[key]
    return config


def _arm_specs(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    arms = config.get("arms")
    return [a for a in arms.values() if isinstance(a, dict)] if isinstance(arms, dict) else []


def analysis_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings every analysis output is computed with, `AnalysisSettings` built once from the
    validated config (`analysis:` plus the campaign's engines in registry order, the gap's
    numerator first), as the plain mapping rule params and a bundle's manifest carry;
    `AnalysisSettings.from_mapping` reads it back."""
    section = config["analysis"]
    settings = AnalysisSettings(
        keeps_pace=section["keeps_pace"],
        phi_guard=section["phi_guard"],
        exclude_first_graph=section["exclude_first_graph"],
        engines=tuple(e for e in engine_names() if e in config["engines"]),
        table_conditions=tuple(section.get("table_conditions", STUDY_TABLE_CONDITIONS)),
        multiplicity=section.get("multiplicity", AnalysisSettings.multiplicity),
        control_differs=bool(section.get("control_differs", False)),
    )
    return settings.as_dict()


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML config file's mapping, not yet validated; ConfigError names the file."""
    path = Path(path)
    try:
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read configuration ({exc})") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return config


def config_text(config: Mapping[str, Any]) -> str:
    """A configuration as YAML that `read_config_file` reads back to the same mapping (keys in
    their order, block style): an ablation's merged configuration, written beside its results."""
    return str(yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True, width=100))


def prepare_config(config: dict[str, Any]) -> dict[str, Any]:
    """Drop the engines an overlay set to null, then validate (in place): what the Snakefile does
    to the configuration Snakemake merged, and what every CLI command does to the one it read."""
    drop_removed_engines(config)
    validate_config(config)
    return config


def load_config(
    path: str | Path,
    configfiles: Sequence[str | Path] = (),
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The validated configuration the workflow uses for `--configfile CONFIGFILES` laid over
    `path`: each file merged in order by Snakemake's own merge (`snakemake.utils.update_config`,
    mappings key by key, anything else replaced), then top-level `overrides` (`--config K=V`),
    then `prepare_config`."""
    from snakemake.utils import update_config  # 0.1 s to import: only where a file is merged

    config = read_config_file(path)
    for overlay in configfiles:
        update_config(config, read_config_file(overlay))
    config.update(overrides or {})
    return prepare_config(config)


def add_config_arguments(parser: Any, default: str | None = "config/config.yaml") -> None:
    """`--config FILE` and `--configfile FILE...`, for every command that reads the configuration
    (the same merge as `snakemake --configfile`, through `load_config`). With `default` None the
    configuration is optional (`args.config` None: not given)."""
    parser.add_argument(
        "--config",
        default=default,
        metavar="FILE",
        help=f"the base configuration (default: {default})" if default else "the configuration",
    )
    parser.add_argument(
        "--configfile",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="configuration files merged over it in order, as snakemake --configfile does "
        "(an engine set to null there is removed)",
    )


# --------------------------------------------------------------------------- grid expansion


def conditions(config: Mapping[str, Any]) -> dict[str, Condition]:
    out: dict[str, Condition] = {}
    for cond in config["conditions"]:
        cid = condition_id(cond["sweep"], cond[SWEEP_PARAMETER[cond["sweep"]]])
        trace = cond.get("trace")
        source = None
        if trace is not None:
            limit = trace.get("max_request_tokens")
            source = TraceSource(
                format=str(trace["format"]),
                path=str(trace["path"]),
                start_s=float(trace.get("start_s", 0.0)),
                max_request_tokens=None if limit is None else int(limit),
            )
        out[cid] = Condition(
            id=cid,
            sweep=cond["sweep"],
            rate=float(cond["rate"]),
            sharing=float(cond.get("sharing", 0.0)),
            prompt_tokens=int(cond.get("prompt_tokens", 0)),
            duration_s=float(cond["duration_s"]),
            trace=source,
        )
    return out


def reps(config: Mapping[str, Any]) -> list[str]:
    return [f"rep{k}" for k in range(1, int(config["repetitions"]) + 1)]


def arm_conditions(config: Mapping[str, Any], arm: str, engine: str) -> list[str]:
    spec = config["arms"][arm]
    listed = list(conditions(config)) if spec["conditions"] == "all" else list(spec["conditions"])
    skip = set(spec["engines"][engine].get("skip_conditions", []))
    return [c for c in listed if c not in skip]


def deployment_for(config: Mapping[str, Any], arm: str, engine: str, condition: str) -> Deployment:
    espec = config["arms"][arm]["engines"][engine]
    flags = (
        *config["engines"][engine]["flags"],
        *espec["flags"],
        *espec.get("flags_by_condition", {}).get(condition, []),
    )
    return Deployment(
        arm=arm,
        engine=engine,
        flags=tuple(flags),
        expect_chunked_prefill=bool(espec["expect"]["chunked_prefill"]),
        expect_chunk_size=espec["expect"].get("chunk_size"),
        expect_schedule_policy=espec["expect"].get("schedule_policy"),
        expect_kv_capacity_tokens=espec["expect"].get("kv_capacity_tokens"),
        expect_kv_capacity_tolerance=espec["expect"].get("kv_capacity_tolerance"),
    )


def deployment_record(config: Mapping[str, Any], deployment: Deployment) -> dict[str, Any]:
    """A deployment as the deploy and run jobs get it: id, arm, engine, flags, the engine's image
    and port, and the chunked-prefill setting its arm expects; the schedule policy and KV capacity
    only when the arm expects them (so a deployment that expects neither has the record, and the
    identity, it always had)."""
    engine = config["engines"][deployment.engine]
    record: dict[str, Any] = {
        "deployment_id": deployment.id,
        "arm": deployment.arm,
        "engine": deployment.engine,
        "flags": list(deployment.flags),
        "image": engine.get("image"),
        "port": engine["port"],
        "expect_chunked_prefill": deployment.expect_chunked_prefill,
        "expect_chunk_size": deployment.expect_chunk_size,
    }
    for key in OPTIONAL_EXPECTATIONS:
        value = getattr(deployment, f"expect_{key}")
        if value is not None:
            record[f"expect_{key}"] = value
    return record


def vendor_default_flags(config: Mapping[str, Any], engine: str) -> tuple[str, ...]:
    """`engine`'s command line under vendor defaults: the flags every deployment passes plus the
    defaults arm's (no condition's), as results/defaults_diff.csv resolves them."""
    arm = config["arms"].get("defaults", {}).get("engines", {}).get(engine) or {}
    return (*config["engines"][engine]["flags"], *arm.get("flags", []))


def request_slo(config: Mapping[str, Any]) -> dict[str, float | None]:
    """The per-request SLO limits results/run_metrics.csv applies (config `analysis.slo`; a key
    left out takes its default: TTFT 2 s, TPOT 0.1 s, no E2E limit; null: not applied)."""
    defaults: dict[str, float | None] = asdict(RequestSlo())
    given = config["analysis"].get("slo") or {}
    return {key: given.get(key, value) for key, value in defaults.items()}


def node_usd_per_hour(config: Mapping[str, Any]) -> float | None:
    """USD per hour of the node a run of this campaign occupies: `analysis.cost.node_usd_per_hour`
    for the campaign's `gpu.name`, None when no price is configured for it (the dollar figures of
    results/run_metrics.csv and results/capacity.csv are then null)."""
    cost = CostSettings.from_config((config.get("analysis") or {}).get("cost"))
    return cost.price(str(config["gpu"]["name"]))


def defaults_diff_gpus(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPUs results/defaults_diff.csv resolves the defaults on: `defaults_diff.gpus`, else
    the campaign's GPU."""
    listed = (config.get("defaults_diff") or {}).get("gpus")
    gpus = listed or [config["gpu"]]
    return [{"name": str(g["name"]), "memory_mib": int(g["memory_mib"])} for g in gpus]


def runs(config: Mapping[str, Any]) -> list[Run]:
    """Every run of the grid, ordered by deployment so each deployment comes up once."""
    out: list[Run] = []
    for arm in config["arms"]:
        for engine in config["arms"][arm]["engines"]:
            for cid in arm_conditions(config, arm, engine):
                out.extend(Run(arm, engine, cid, rep) for rep in reps(config))
    order = {d: i for i, d in enumerate(dict.fromkeys(deployments(config, out)))}
    return sorted(out, key=lambda r: order[deployment_for(config, r.arm, r.engine, r.condition).id])


def deployments(config: Mapping[str, Any], run_list: list[Run] | None = None) -> list[str]:
    """Deployment ids in first-use order."""
    if run_list is None:
        run_list = runs(config)
    ids = [deployment_for(config, r.arm, r.engine, r.condition).id for r in run_list]
    return list(dict.fromkeys(ids))


def gpu_nodes(config: Mapping[str, Any]) -> int:
    """Config `campaign.gpu_nodes`: how many GPU nodes measure in parallel (default 1)."""
    return int((config.get("campaign") or {}).get("gpu_nodes", 1))


def node_slots(config: Mapping[str, Any]) -> dict[str, int]:
    """Each of the grid's deployments pinned to one of `campaign.gpu_nodes` node slots (0..N-1),
    so that its blocks (and its floor) run on one node with one cache history, as in the study.

    Balanced by the arrival time each deployment measures (the sum of its runs' `duration_s`):
    longest first, each to the least-loaded slot, ties to the lower slot and, between equal
    deployments, to first-use order. Depends only on the grid and N, so every job of one
    invocation, and a resumed one, agrees; it is operational (servelab.grid.identity): where a
    block runs, never what it measures."""
    n = gpu_nodes(config)
    cond = conditions(config)
    order: dict[str, int] = {}
    load: dict[str, float] = {}
    for run in runs(config):
        d = deployment_for(config, run.arm, run.engine, run.condition).id
        order.setdefault(d, len(order))
        load[d] = load.get(d, 0.0) + cond[run.condition].duration_s
    slot_load = [0.0] * n
    slots: dict[str, int] = {}
    for d in sorted(order, key=lambda d: (-load[d], order[d])):
        k = min(range(n), key=lambda i: (slot_load[i], i))
        slots[d] = k
        slot_load[k] += load[d]
    return {d: slots[d] for d in order}


def node_slot(config: Mapping[str, Any], deployment_id: str) -> int:
    """The node slot of `deployment_id`: the grid's assignment (`node_slots`); a deployment outside
    the grid (a capacity search's, `capacity-{search}`) by the first 63 bits of its id's SHA-256,
    modulo N."""
    slots = node_slots(config)
    if deployment_id in slots:
        return slots[deployment_id]
    digest = int(hashlib.sha256(deployment_id.encode()).hexdigest()[:16], 16) >> 1
    return digest % gpu_nodes(config)


def trace_seed(campaign_seed: int, condition: str, rep: str) -> int:
    """A 63-bit seed from (campaign_seed, condition, rep) only: never engine or arm."""
    digest = hashlib.sha256(
        f"servelab-trace\0{campaign_seed}\0{condition}\0{rep}".encode()
    ).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def offered_load(condition: Condition, workload: Mapping[str, Any]) -> float:
    """Λ: requests per second offered: λ times the requests of a graph (planner, workers,
    aggregator), on average over `workload.topologies`; a condition replaying an imported trace
    offers its rate (each request is its own graph)."""
    if condition.trace is not None:
        return condition.rate
    return condition.rate * mean_requests_per_graph(workload)


# --------------------------------------------------------------------------- the unloaded floor

# Defaults of config `floor:` (docs/capacity.md, "The unloaded floor").
FLOOR_DEFAULTS = {"requests": 50, "repetitions": 1}
# The bracket's default agreement band: the goal's X band (docs/simulator.md).
FLOOR_BRACKET_BAND = 0.05
# The most requests of a floor shape sent together (config `floor.shapes[].together`).
MAX_FLOOR_TOGETHER = 16


@dataclass(frozen=True)
class FloorShape:
    """A condition without its rate, duration and arrivals: what the floor's requests look like,
    and how many of them are sent together (`together`; 1, one request at a time, unless given:
    servelab.workload.floor, "Prompts sent together")."""

    sharing: float
    prompt_tokens: int
    together: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.together <= MAX_FLOOR_TOGETHER:
            raise ValueError(
                f"config key floor.shapes[].together: must be 1 to {MAX_FLOOR_TOGETHER}, "
                f"got {self.together}"
            )

    @property
    def id(self) -> str:
        """`floor-s0.90-L4096`, or `floor-s0.00-L512-x2` for two requests sent together: the
        floor's condition id (it seeds the floor's trace)."""
        together = f"-x{self.together}" if self.together > 1 else ""
        return f"floor-s{self.sharing:.2f}-L{self.prompt_tokens}{together}"

    @classmethod
    def from_id(cls, floor_id: str) -> FloorShape:
        match = re.fullmatch(r"floor-s([0-9]+\.[0-9]{2})-L([0-9]+)(?:-x([0-9]+))?", floor_id)
        if match is None:
            raise ValueError(f"{floor_id!r} is not a floor id (floor-s<sharing>-L<tokens>[-x<n>])")
        return cls(float(match.group(1)), int(match.group(2)), int(match.group(3) or 1))


@dataclass(frozen=True)
class FloorBlock:
    """The floor of one deployment for one shape its conditions have."""

    deployment: Deployment
    shape: FloorShape

    @property
    def id(self) -> str:
        return f"{self.deployment.id}/{self.shape.id}"


def floor_settings(config: Mapping[str, Any]) -> dict[str, int]:
    """Config `floor:` with its defaults: `requests` per floor run, `repetitions` (seeds)."""
    given = config.get("floor") or {}
    return {key: int(given.get(key, value)) for key, value in FLOOR_DEFAULTS.items()}


def floor_run_config(config: Mapping[str, Any], engine: str | None = None) -> dict[str, Any]:
    """The config `engine`'s floor runs are measured by: the campaign's, with config
    `floor.warmup_requests` (or the engine's own `floor.warmup_requests_by_engine`) and
    `floor.warmup_prompt_tokens` (each when given) as its dispatch's warm-up count and warm-up
    prompt length, and the engine's own `floor.warmup_spacing_s_by_engine` as the seconds between
    their sends. The warm-ups are the floor's only concurrent batch: the one place a CPU
    platform's per-sequence cost, with long prompts its cost of reading many distinct contexts,
    and with more warm-ups than slots the cost of requests waiting for one show
    (docs/simulator.md, "Against the real engines")."""
    floor = config.get("floor") or {}
    given: dict[str, Any] = {
        key: int(floor[key])
        for key in ("warmup_requests", "warmup_prompt_tokens")
        if floor.get(key) is not None
    }
    by_engine = floor.get("warmup_requests_by_engine") or {}
    if engine is not None and by_engine.get(engine) is not None:
        given["warmup_requests"] = int(by_engine[engine])
    spacing = floor.get("warmup_spacing_s_by_engine") or {}
    if engine is not None and spacing.get(engine) is not None:
        given["warmup_spacing_s"] = float(spacing[engine])
    if not given:
        return dict(config)
    return {**config, "dispatch": {**config["dispatch"], **given}}


def floor_idle_gaps(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Config `floor.idle_gaps` ({every, seconds}; servelab.workload.floor), or None."""
    given = (config.get("floor") or {}).get("idle_gaps")
    if not given:
        return None
    return {"every": int(given["every"]), "seconds": [float(x) for x in given["seconds"]]}


def floor_bracket_max_noise(config: Mapping[str, Any]) -> float | None:
    """Config `floor.bracket.max_noise` (the quiet-floor bar), or None: no bar."""
    given = (config.get("floor") or {}).get("bracket") or {}
    return None if given.get("max_noise") is None else float(given["max_noise"])


def floor_bracket_band(config: Mapping[str, Any]) -> float | None:
    """Config `floor.bracket.band`, or None when the floor does not bracket the loaded runs.
    With a bracket, each deployment's floor is made just before its loaded runs and again just
    after them, on the same traces; a deployment whose two floors disagree by more than the band
    was measured while the machine's speed moved, and the comparison does not judge it
    (servelab.sim.cpu_fit.floor_bracket; docs/simulator.md, "The bracketing floor")."""
    given = (config.get("floor") or {}).get("bracket")
    if not given:
        return None
    return float(given.get("band", FLOOR_BRACKET_BAND))


def floor_extra_shapes(config: Mapping[str, Any]) -> list[FloorShape]:
    """Config `floor.shapes`: request shapes every deployment is also measured on unloaded, beyond
    its conditions' own (the single-request step sweep a CPU platform is fitted from:
    docs/simulator.md, "Against the real engines")."""
    given = (config.get("floor") or {}).get("shapes") or []
    return [
        FloorShape(float(s["sharing"]), int(s["prompt_tokens"]), int(s.get("together", 1)))
        for s in given
    ]


def floor_blocks(config: Mapping[str, Any]) -> list[FloorBlock]:
    """One floor per (deployment, shape) of the grid's runs, in run order: each deployment is
    measured unloaded on the request shapes (σ, L) of the conditions it serves, then on config
    `floor.shapes`. A condition replaying an imported trace has no shape of its own (each request
    has its own length): it adds no floor."""
    cond = conditions(config)
    out: dict[tuple[str, str], FloorBlock] = {}
    first_rep = reps(config)[0]
    extra = floor_extra_shapes(config)
    for run in runs(config):
        if run.rep != first_rep:
            continue
        c = cond[run.condition]
        deployment = deployment_for(config, run.arm, run.engine, run.condition)
        # an imported trace has no one request shape: its deployment is floored on floor.shapes
        own = [] if c.trace is not None else [FloorShape(c.sharing, c.prompt_tokens)]
        for shape in (*own, *extra):
            block = FloorBlock(deployment, shape)
            out.setdefault((block.deployment.id, block.shape.id), block)
    return list(out.values())
