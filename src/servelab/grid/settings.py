"""Typed settings: the config's `dispatch`, `campaign`, `telemetry`, `kubernetes`, `sim`,
`local`, `analysis` and `capacity` sections.

One frozen dataclass per section (and per nested section), built once from the validated
configuration with `Settings.from_config(config)`, or one section at a time with
`<Section>.from_section(mapping)`. The dataclass defaults are the only defaults these sections
have: the config schema (config.schema.yaml) names the same keys and sets no default of its own,
and a test checks that the two agree key for key (for the sections in `SECTIONS`).

`AnalysisSettings` (the parameters every analysis output is computed with), `RequestSlo`
(`analysis.slo`), `CostSettings` (`analysis.cost`) and `CapacitySettings` (`capacity:`) live here too: every typed setting in one
module. This module imports nothing from servelab, so every layer may read it.

A key that the schema requires has no default here; a key the config may leave out has its
default here and nowhere else. Mapping-valued keys (`node_selector`, `resources`,
`metrics_selector`, `gpu_metrics_selector`, `pod_monitor.labels`, `dcgm_exporter.pod_labels`)
replace their default as a whole, so a selector can drop a label; nested sections (`timeouts`,
`readiness_probe`, ...) merge key by key.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "MULTIPLICITY_RULES",
    "SECTIONS",
    "STUDY_TABLE_CONDITIONS",
    "AnalysisSettings",
    "CampaignJobSettings",
    "CampaignSettings",
    "CampaignVolume",
    "CapacitySettings",
    "ConfigError",
    "CostSettings",
    "DcgmExporterSettings",
    "DispatchSettings",
    "HfTokenSecret",
    "KubernetesSettings",
    "KubernetesTimeouts",
    "ModelVolume",
    "PlatformSettings",
    "PodMonitorSettings",
    "ReadinessProbe",
    "RequestSlo",
    "Settings",
    "SettingsError",
    "Shape",
    "SimSettings",
    "TelemetrySettings",
]

_Section = TypeVar("_Section")


class ConfigError(ValueError):
    """Invalid configuration. The message names the key (as a path such as `conditions[2].rate`)."""


class SettingsError(ValueError):
    """A settings section that does not fit its dataclass; the message names the key."""


def _coerce(hint: Any, value: Any, where: str) -> Any:
    """`value` as the field's type: nested sections built, numbers made int/float as declared."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise SettingsError(f"config key {where}: expected a mapping, got {value!r}")
        return _build(hint, value, where)
    if hint in (int, float, str, bool):
        return hint(value)
    if typing.get_origin(hint) is tuple:
        return tuple(value)
    if typing.get_origin(hint) is dict:
        return dict(value)
    return value  # unions such as `str | None`: as validated


def _build(cls: type[_Section], section: Mapping[str, Any] | None, where: str) -> _Section:
    """`cls` from a config section: given keys over the dataclass defaults (nested ones too)."""
    given = dict(section or {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise SettingsError(f"config key {where}: unknown key(s) {', '.join(map(repr, unknown))}")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}") for k, v in given.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required key is missing
        raise SettingsError(f"config key {where}: {exc}") from exc


class _ConfigSection:
    """What every top-level section has: built from its config mapping, and read back as one."""

    config_key: ClassVar[str]  # the section's key in the config

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> Self:
        return _build(cls, section, cls.config_key)

    def as_dict(self) -> dict[str, Any]:
        """The section as the plain mapping the config spells (nested sections as mappings)."""
        return dataclasses.asdict(cast("DataclassInstance", self))


# --------------------------------------------------------------------------- dispatch


@dataclass(frozen=True)
class DispatchSettings(_ConfigSection):
    """The config's `dispatch:` section: how the live dispatcher sends a trace."""

    config_key: ClassVar[str] = "dispatch"

    warmup_requests: int
    request_timeout_s: float
    ignore_eos: bool = True
    # Tokens of each warm-up prompt; None: the protocol's 128 (dispatch.run.WARMUP_PROMPT_TOKENS).
    warmup_prompt_tokens: int | None = None
    # Seconds between two warm-ups' sends; None: all at once (the protocol's t = 0), and no part
    # of a measurement's identity, so the keys made before the setting existed still hold.
    warmup_spacing_s: float | None = None
    stream_interval: int = 1
    # Longest wait for the engine's /health before the first request (a model load is minutes).
    health_timeout_s: float = 900.0
    workers: int = 1
    # "paced": a pacer process sends each request on time, the event loop reads (plain http only).
    client: str = "paced"


# --------------------------------------------------------------------------- campaign


@dataclass(frozen=True)
class CampaignSettings(_ConfigSection):
    """The config's `campaign:` section: pauses, pass mark, retries and (tests) injected faults."""

    config_key: ClassVar[str] = "campaign"

    pause_between_runs_s: float
    success_threshold: float
    retries: int
    gpu_nodes: int = 1
    faults: tuple[dict[str, Any], ...] = ()


# --------------------------------------------------------------------------- telemetry


@dataclass(frozen=True)
class TelemetrySettings(_ConfigSection):
    """The config's `telemetry:` section: the Prometheus a live run's window is pulled from."""

    config_key: ClassVar[str] = "telemetry"

    step_s: float
    prometheus_url: str


# --------------------------------------------------------------------------- kubernetes


@dataclass(frozen=True)
class KubernetesTimeouts:
    """`kubernetes.timeouts`: every wait of the backend is bounded by one of these (seconds)."""

    ready_s: float = 1800.0
    delete_s: float = 300.0
    poll_s: float = 5.0
    request_s: float = 30.0


@dataclass(frozen=True)
class ModelVolume:
    """`kubernetes.model_volume`: the PersistentVolumeClaim holding the Hugging Face cache."""

    claim_name: str = "servelab-models"
    size: str = "60Gi"
    storage_class: str | None = "standard-rwo"
    mount_path: str = "/root/.cache/huggingface"


@dataclass(frozen=True)
class HfTokenSecret:
    """`kubernetes.hf_token_secret`: the Secret (name, key) the engine reads its token from."""

    name: str = "hf-token"
    key: str = "token"


@dataclass(frozen=True)
class ReadinessProbe:
    """`kubernetes.readiness_probe` of the engine container (seconds are whole: the API's)."""

    path: str = "/health"
    initial_delay_s: int = 60
    period_s: int = 10
    timeout_s: int = 5
    failure_threshold: int = 3


@dataclass(frozen=True)
class PodMonitorSettings:
    """`kubernetes.pod_monitor`: what kube-prometheus-stack needs to scrape the engine."""

    labels: dict[str, str] = field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    interval: str = "5s"

    @property
    def interval_s(self) -> float:
        """`interval` (a Prometheus duration such as 5s, 500ms, 1m) in seconds."""
        match = re.fullmatch(r"(\d+)(ms|s|m|h)", self.interval.strip())
        if not match:
            raise SettingsError(
                f"kubernetes.pod_monitor.interval {self.interval!r}: expected e.g. 5s"
            )
        return int(match[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match[2]]


@dataclass(frozen=True)
class CampaignVolume:
    """`kubernetes.campaign_job.volume`: the PersistentVolumeClaim the campaign Job keeps
    `results/` and `.snakemake/` on (its state across pods: what makes a resumed Job redo
    nothing)."""

    claim_name: str = "servelab-campaign"
    size: str = "20Gi"
    storage_class: str | None = "standard-rwo"


@dataclass(frozen=True)
class CampaignJobSettings:
    """`kubernetes.campaign_job`: the campaign itself as a Job on the CPU node
    (`servelab campaign submit`; docs/kubernetes.md, "The campaign as a Job"). Operational:
    where the driver runs, never what it measures."""

    # Names the Job, its ServiceAccount, Role, RoleBinding and ConfigMap (and, with the
    # namespace, its ClusterRole and ClusterRoleBinding).
    name: str = "servelab-campaign"
    # servelab's image, pinned by digest (the repository's Dockerfile); `submit --image` wins.
    image: str | None = None
    # The CPU node pool (GKE names its pods' pool by this label): the study's generator placement.
    node_selector: dict[str, str] = field(
        default_factory=lambda: {"cloud.google.com/gke-nodepool": "default-pool"}
    )
    resources: dict[str, str | int | float] = field(
        default_factory=lambda: {"cpu": "2", "memory": "4Gi"}
    )
    volume: CampaignVolume = field(default_factory=CampaignVolume)
    # Pods that fail (other than by a disruption: eviction, preemption, node shutdown, which
    # never count) before the Job gives up.
    backoff_limit: int = 3
    # `servelab campaign fetch`: the longest the helper pod lives and the copy may take.
    fetch_timeout_s: float = 3600.0


@dataclass(frozen=True)
class DcgmExporterSettings:
    """`kubernetes.dcgm_exporter`: the GPU's DCGM exporter pods the rendered PodMonitor
    (`podmonitor-dcgm.yaml`) scrapes. The defaults are GKE's managed DCGM: a DaemonSet in
    gke-managed-system whose pods carry app.kubernetes.io/name=gke-managed-dcgm-exporter and serve
    /metrics on the container port named `metrics` (9400)."""

    # false: no PodMonitor is rendered (the cluster scrapes the exporter its own way, or has none)
    enabled: bool = True
    namespace: str = "gke-managed-system"
    pod_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "gke-managed-dcgm-exporter"}
    )
    port: str = "metrics"


@dataclass(frozen=True)
class KubernetesSettings(_ConfigSection):
    """The config's `kubernetes:` section (docs/kubernetes.md says what each key does)."""

    config_key: ClassVar[str] = "kubernetes"

    # None: in-cluster when running in a pod, else $KUBECONFIG or ~/.kube/config.
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str = "servelab"
    run_label: str = "servelab"
    node_selector: dict[str, str] = field(
        default_factory=lambda: {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    )
    gpu_resource: str = "nvidia.com/gpu"
    gpu_taint_key: str = "nvidia.com/gpu"
    resources: dict[str, str | int | float] = field(
        default_factory=lambda: {"cpu": "4", "memory": "16Gi"}
    )
    image_pull_policy: str = "IfNotPresent"
    termination_grace_period_s: int = 30
    # Seconds between node-identity reads during a run (0: at its start and end only).
    node_watch_s: float = 15.0
    model_volume: ModelVolume = field(default_factory=ModelVolume)
    hf_token_secret: HfTokenSecret = field(default_factory=HfTokenSecret)
    readiness_probe: ReadinessProbe = field(default_factory=ReadinessProbe)
    sglang_shm_size: str = "10Gi"
    pod_monitor: PodMonitorSettings = field(default_factory=PodMonitorSettings)
    engine_url: str = "http://{service}.{namespace}.svc.cluster.local:{port}"
    # Prometheus labels of the engine's series ({namespace}, {deployment_id} filled in): the
    # PodMonitor copies the pod label servelab.dev/deployment as servelab_dev_deployment.
    metrics_selector: dict[str, str] = field(
        default_factory=lambda: {
            "namespace": "{namespace}",
            "servelab_dev_deployment": "{deployment_id}",
        }
    )
    # The GPU energy and power series (DCGM) of the engine's GPU: the exporter's PodMonitor, and
    # the label matchers of the engine GPU's series ({node}, {pod}, {namespace}, {deployment_id}
    # filled in; `node` is the label the rendered PodMonitor copies from the exporter pod's
    # node). Empty: no GPU series are pulled (the energy figures are then null).
    dcgm_exporter: DcgmExporterSettings = field(default_factory=DcgmExporterSettings)
    gpu_metrics_selector: dict[str, str] = field(default_factory=lambda: {"node": "{node}"})
    timeouts: KubernetesTimeouts = field(default_factory=KubernetesTimeouts)
    campaign_job: CampaignJobSettings = field(default_factory=CampaignJobSettings)

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | KubernetesSettings | None) -> Self:
        if isinstance(section, cls):
            return section
        return _build(cls, section, cls.config_key)  # type: ignore[arg-type]

    def engine_url_for(self, deployment_id: str, port: int) -> str:
        """Where the dispatcher reaches the engine: `engine_url` with {service}, {namespace},
        {port} (and {deployment_id}) filled in."""
        return self.engine_url.format(
            service=deployment_id, namespace=self.namespace, port=port, deployment_id=deployment_id
        )

    def metrics_selector_for(self, deployment_id: str) -> dict[str, str]:
        """Prometheus label matchers of the deployment's series."""
        return {
            key: str(value).format(namespace=self.namespace, deployment_id=deployment_id)
            for key, value in self.metrics_selector.items()
        }

    def gpu_metrics_selector_for(
        self, deployment_id: str, *, node: str, pod: str
    ) -> dict[str, str]:
        """Prometheus label matchers of the engine GPU's DCGM series, for the engine pod `pod` on
        node `node` (empty: no GPU series are pulled)."""
        return {
            key: str(value).format(
                namespace=self.namespace, deployment_id=deployment_id, node=node, pod=pod
            )
            for key, value in self.gpu_metrics_selector.items()
        }


# --------------------------------------------------------------------------- all of them


@dataclass(frozen=True)
class Settings:
    """Every typed section a deployment or a run reads."""

    dispatch: DispatchSettings
    campaign: CampaignSettings
    telemetry: TelemetrySettings
    kubernetes: KubernetesSettings

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """From a validated config, or from a run's settings (which carry the same sections)."""
        return cls(
            dispatch=DispatchSettings.from_section(config["dispatch"]),
            campaign=CampaignSettings.from_section(config["campaign"]),
            telemetry=TelemetrySettings.from_section(config["telemetry"]),
            kubernetes=KubernetesSettings.from_section(config.get("kubernetes")),
        )


# --------------------------------------------------------------------------- sim


@dataclass(frozen=True)
class PlatformSettings:
    """`sim.platform`: the simulated platform's drift and noise (servelab.sim.platform)."""

    enabled: bool = True
    # sd of ln(drift), drawn once per deployment (docs/simulator.md, "The platform model")
    deployment_sd: float = 0.012
    # sd of ln(noise), drawn once per run
    run_sd: float = 0.010


@dataclass(frozen=True)
class SimSettings(_ConfigSection):
    """The config's `sim:` section: what only the simulator reads. It defines a simulated
    measurement, and only on the sim backend (servelab.grid.identity.run_identity)."""

    config_key: ClassVar[str] = "sim"

    platform: PlatformSettings = field(default_factory=PlatformSettings)


# --------------------------------------------------------------------------- local


@dataclass(frozen=True)
class LocalSettings(_ConfigSection):
    """The config's `local:` section: the cores a real engine on this machine and its client run
    on (servelab.deploy.machine_load). Part of the deployment's identity when set: a pinned
    engine is measured on other terms than an unpinned one."""

    config_key: ClassVar[str] = "local"

    engine_cpus: tuple[int, ...] = ()
    client_cpus: tuple[int, ...] = ()
    # A run whose pinned cores gave more than this share of the window to other processes is
    # refused (status failed).
    max_foreign_share: float = 0.1

    @property
    def pinned(self) -> bool:
        return bool(self.engine_cpus) and bool(self.client_cpus)


# --------------------------------------------------------------------------- analysis

# The conditions the study's Tables 4-6 show; a campaign on another grid names its own
# (config `analysis.table_conditions`).
STUDY_TABLE_CONDITIONS: tuple[str, ...] = ("rate-0.12", "rate-0.28", "length-8192")
# How the p-values of the campaign's paired tests are adjusted for their number (config
# `analysis.multiplicity`): "none" (the study's), or "holm" (Holm 1979, family-wise error rate).
MULTIPLICITY_RULES: tuple[str, ...] = ("none", "holm")


@dataclass(frozen=True)
class AnalysisSettings:
    """The parameters every analysis output is computed with: config `analysis:` plus the
    campaign's engines (servelab.grid.config.analysis_settings builds its plain mapping from the
    validated config). Passed whole through servelab.analysis.pipeline; the defaults here are the
    only ones (the analysis without a configuration, e.g. `servelab analyze` without --config).

    Numbers are kept as the config spells them (an integer stays one): numbers.json records them.
    """

    # an engine keeps pace when X >= keeps_pace x the offered load
    keeps_pace: float = 0.97
    # phi is reported only when |ln R_def| > ln phi_guard
    phi_guard: float = 1.1
    exclude_first_graph: bool = True
    # the campaign's engines in gap order (registry order); None: those the runs show
    engines: tuple[str, ...] | None = None
    table_conditions: tuple[str, ...] = STUDY_TABLE_CONDITIONS
    # the adjustment of the campaign's paired tests for their number (MULTIPLICITY_RULES)
    multiplicity: str = "none"
    # The control engine's configuration differs between the arms by design (an ablation that
    # changes it in one arm: config/ablations/sglang-fcfs.yaml). Table 4 then compares its two
    # configurations, with a note; when false (the study's design) a difference is refused.
    control_differs: bool = False

    def __post_init__(self) -> None:
        if self.multiplicity not in MULTIPLICITY_RULES:
            raise SettingsError(
                f"analysis.multiplicity: {self.multiplicity!r} is not one of "
                f"{', '.join(MULTIPLICITY_RULES)}"
            )

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> AnalysisSettings:
        """From the plain mapping (`as_dict`: a rule's params, a bundle's manifest); a key left out
        takes its default."""
        given = dict(settings)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - names)
        if unknown:
            raise SettingsError(
                f"analysis settings: unknown key(s) {', '.join(map(repr, unknown))}"
            )
        if given.get("engines") is not None:
            given["engines"] = tuple(given["engines"])
        if "table_conditions" in given:
            given["table_conditions"] = tuple(given["table_conditions"])
        return cls(**given)

    def as_dict(self) -> dict[str, Any]:
        """The plain mapping (sequences as lists): what rule params and a bundle's manifest hold.
        `control_differs` only when true: a campaign that does not set it keeps the mapping (and
        the analysis rules' params) it always had."""
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        if not self.control_differs:
            del out["control_differs"]
        return out


@dataclass(frozen=True)
class RequestSlo:
    """Per-request limits (seconds; None: not applied), config `analysis.slo`. Default: MLPerf's
    Llama-3.1-8B Server pair, TTFT 2 s and TPOT 100 ms, and no E2E limit."""

    ttft_s: float | None = 2.0
    tpot_s: float | None = 0.1
    e2e_s: float | None = None

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> RequestSlo:
        """From config `analysis.slo` (keys ttft_s, tpot_s, e2e_s; a missing key takes its
        default, null means not applied)."""
        section = dict(section or {})
        unknown = set(section) - {"ttft_s", "tpot_s", "e2e_s"}
        if unknown:
            raise ValueError(f"analysis.slo: unknown key(s) {', '.join(sorted(unknown))}")
        values = {**asdict(cls()), **section}
        return cls(**{k: None if v is None else float(v) for k, v in values.items()})


@dataclass(frozen=True)
class CostSettings:
    """Config `analysis.cost`: what the node a run occupies costs per hour (USD), by `gpu.name`
    (docs/analysis.md, "Energy and cost per token"). An analysis input, never a measurement's: a
    GPU without a price gets no dollar figure (null), never a made-up one; config/config.yaml
    sets the study's L4 node's cited Spot price."""

    node_usd_per_hour: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> CostSettings:
        """From config `analysis.cost` (None or {}: no price for any GPU)."""
        section = dict(section or {})
        unknown = set(section) - {"node_usd_per_hour"}
        if unknown:
            raise SettingsError(f"analysis.cost: unknown key(s) {', '.join(sorted(unknown))}")
        prices = dict(section.get("node_usd_per_hour") or {})
        return cls({str(gpu): float(usd) for gpu, usd in prices.items()})

    def price(self, gpu: str) -> float | None:
        """USD per node-hour on `gpu` (a `gpu.name`), or None when none is configured."""
        return self.node_usd_per_hour.get(gpu)


# --------------------------------------------------------------------------- capacity


@dataclass(frozen=True)
class Shape:
    """`capacity.shapes[]`: a condition without its rate (docs/capacity.md)."""

    name: str
    sharing: float
    prompt_tokens: int
    duration_s: float


@dataclass(frozen=True)
class CapacitySettings:
    """Config `capacity:` (docs/capacity.md)."""

    shapes: tuple[Shape, ...]
    bracket: tuple[float, float] | None
    saturation_rate: float
    saturation_duration_s: float
    tolerance: float
    max_probes: int
    repetitions: int
    keeps_pace: float
    limits: Mapping[str, float]  # e.g. {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CapacitySettings:
        section = config.get("capacity")
        if not section:
            raise ConfigError("config key capacity: not set (docs/capacity.md)")
        bracket = section.get("bracket")
        return cls(
            shapes=tuple(
                Shape(
                    str(s["name"]),
                    float(s["sharing"]),
                    int(s["prompt_tokens"]),
                    float(s["duration_s"]),
                )
                for s in section["shapes"]
            ),
            bracket=(float(bracket[0]), float(bracket[1])) if bracket else None,
            saturation_rate=float(section.get("saturation_rate", 2.0)),
            saturation_duration_s=float(section.get("saturation_duration_s", 120.0)),
            tolerance=float(section.get("tolerance", 0.02)),
            max_probes=int(section.get("max_probes", 12)),
            repetitions=int(section.get("repetitions", config["repetitions"])),
            keeps_pace=float(section.get("keeps_pace", config["analysis"]["keeps_pace"])),
            limits=dict(section.get("limits", {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1})),
        )

    def shape(self, name: str) -> Shape:
        for shape in self.shapes:
            if shape.name == name:
                return shape
        raise ConfigError(f"config key capacity.shapes: no shape named {name!r}")


# The config sections that have a dataclass here, by their config key.
SECTIONS: dict[str, type[Any]] = {
    "dispatch": DispatchSettings,
    "campaign": CampaignSettings,
    "telemetry": TelemetrySettings,
    "kubernetes": KubernetesSettings,
    "sim": SimSettings,
}
