"""Ablations: the study's open questions, each one configuration away (docs/ablations.md).

An ablation is a file `config/ablations/NAME.yaml` with a top-level `ablation:` section: an overlay
laid over the study's configuration (`ablation.base`, default `config/config.yaml`) by Snakemake's
own merge (`snakemake.utils.update_config`: mappings key by key, anything else replaced), then
validated like any configuration. Its `variants` (optional) are overlays laid over it in turn, one
campaign each (`gpus`: one per GPU). The workflow loads every ablation as a Snakemake module of the
whole workflow whose paths `results/...` become `results/ablations/ID/...`
(workflow/rules/ablations.smk), so each writes its own tables and figures through the same rules.

A file of `config/ablations/` without an `ablation:` section is a plain overlay for
`--configfile` (config/ablations/cpu-sglang-lpm.yaml), not an ablation.

`ablation.kv_capacity: {tokens: T}` equalises the KV capacity of every deployment at T tokens: for
each arm and engine, the engine's own memory-fraction flag (`EngineSpec.memory_fraction_flag`:
vLLM's `--gpu-memory-utilization`, SGLang's `--mem-fraction-static`) is derived from the engine's
memory rule (`servelab.sim.memory`, as `servelab.sim.run.kv_capacity` applies it to the resolved
configuration, on the ablation's GPU and model), replacing the flag's value in the engine's base
flags; and the arm expects `kv_capacity_tokens: T`, which the gate checks against the start-up
log. `derived` records every value and the default it replaced (`ablation.json`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from servelab.engines import (
    ResolutionError,
    ResolvedConfig,
    engine_spec,
    resolve,
    runtime_limits,
)
from servelab.grid.config import (
    ConfigError,
    arm_conditions,
    deployment_for,
    prepare_config,
    read_config_file,
)
from servelab.sim.presets import GpuPreset, ModelPreset, gpu_preset, model_preset
from servelab.sim.run import kv_capacity

__all__ = [
    "ABLATIONS_DIR",
    "DEFAULT_BASE",
    "RESULTS_DIR",
    "Ablation",
    "ablation_files",
    "derive_memory_fraction",
    "load_ablations",
    "logged_kv_capacity",
]

ABLATIONS_DIR = "config/ablations"
RESULTS_DIR = "results/ablations"
DEFAULT_BASE = ("config/config.yaml",)
NAME = r"^[a-z0-9][a-z0-9-]*$"

# The `ablation:` section (validated before the overlay is merged).
SECTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["question"],
    "properties": {
        "question": {"type": "string", "minLength": 1},
        "base": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "variants": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": NAME},
            "additionalProperties": {"type": "object"},
        },
        "kv_capacity": {
            "type": "object",
            "additionalProperties": False,
            "required": ["tokens"],
            "properties": {
                "tokens": {"type": "integer", "minimum": 1},
                "tolerance": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            },
        },
    },
}


@dataclass(frozen=True)
class Ablation:
    """One campaign of an ablation: the file's overlay (and one of its variants) over its base."""

    name: str
    variant: str | None
    question: str
    overlay: str  # the file, relative to the workflow's folder
    base: tuple[str, ...]
    config: dict[str, Any] = field(repr=False)
    derived: tuple[dict[str, Any], ...] = ()
    sources: tuple[tuple[str, str], ...] = ()  # (file, SHA-256) of every file merged, in order

    @property
    def id(self) -> str:
        """`NAME` or `NAME/VARIANT`: its folder under results/ablations/."""
        return self.name if self.variant is None else f"{self.name}/{self.variant}"

    @property
    def results_dir(self) -> str:
        return f"{RESULTS_DIR}/{self.id}"

    @property
    def slug(self) -> str:
        """The id as a Python name: `sglang_fcfs`, `gpus_a100_40gb` (its rules' prefix)."""
        return re.sub(r"[^a-z0-9]+", "_", self.id)

    def record(self) -> dict[str, Any]:
        """What `results/ablations/ID/ablation.json` holds (besides the workflow's outputs)."""
        return {
            "ablation": self.name,
            "variant": self.variant,
            "id": self.id,
            "question": self.question,
            "overlay": self.overlay,
            "base": list(self.base),
            "sources": [{"file": f, "sha256": digest} for f, digest in self.sources],
            "results_dir": self.results_dir,
            "backend": self.config["backend"],
            "gpu": dict(self.config["gpu"]),
            "derived": [dict(d) for d in self.derived],
        }


def ablation_files(root: str | Path = ".") -> list[Path]:
    """The ablations' files (`config/ablations/*.yaml` with an `ablation:` section), by name."""
    folder = Path(root) / ABLATIONS_DIR
    return [p for p in sorted(folder.glob("*.yaml")) if "ablation" in read_config_file(p)]


def load_ablations(root: str | Path = ".") -> list[Ablation]:
    """Every ablation campaign of the workflow in `root`, validated (ConfigError names the file)."""
    root = Path(root)
    found: list[Ablation] = []
    for path in ablation_files(root):
        found += _load_file(root, path)
    return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_file(root: Path, path: Path) -> list[Ablation]:
    from snakemake.utils import update_config  # the merge `snakemake --configfile` does

    where = path.relative_to(root).as_posix()
    if not re.match(NAME, path.stem):
        raise ConfigError(f"{where}: an ablation's file name must match {NAME}")
    overlay = read_config_file(path)
    section = overlay.pop("ablation")
    try:
        jsonschema.validate(section, SECTION_SCHEMA)
    except jsonschema.ValidationError as exc:
        at = ".".join(str(p) for p in exc.absolute_path)
        raise ConfigError(
            f"{where}: ablation.{at}: {exc.message}" if at else f"{where}: {exc.message}"
        ) from None
    base = tuple(section.get("base", DEFAULT_BASE))
    merged: dict[str, Any] = {}
    sources = []
    for name in base:
        update_config(merged, read_config_file(root / name))
        sources.append((name, _sha256(root / name)))
    update_config(merged, overlay)
    sources.append((where, _sha256(path)))
    variants: Mapping[str, Any] = section.get("variants") or {None: {}}
    out = []
    for variant, variant_overlay in variants.items():
        config = copy.deepcopy(merged)
        update_config(config, copy.deepcopy(variant_overlay))
        label = where if variant is None else f"{where}, variant {variant}"
        derived: tuple[dict[str, Any], ...] = ()
        try:
            prepare_config(config)
            if "kv_capacity" in section:
                derived = equalise_kv_capacity(
                    config,
                    int(section["kv_capacity"]["tokens"]),
                    float(section["kv_capacity"].get("tolerance", 0.0)),
                )
                prepare_config(config)
        except (ConfigError, ValueError) as exc:
            raise ConfigError(f"{label}: {exc}") from None
        out.append(
            Ablation(
                name=path.stem,
                variant=variant,
                question=" ".join(str(section["question"]).split()),
                overlay=where,
                base=base,
                config=config,
                derived=derived,
                sources=tuple(sources),
            )
        )
    return out


# ----------------------------------------------------------------------------- KV capacity


def _platform(config: Mapping[str, Any]) -> tuple[GpuPreset, int, ModelPreset]:
    preset_name = config["model"].get("preset")
    if preset_name is None:
        raise ConfigError("ablation.kv_capacity: needs model.preset (the model's dimensions)")
    return (
        gpu_preset(str(config["gpu"]["name"])),
        int(config["gpu"]["memory_mib"]),
        model_preset(str(preset_name)),
    )


def _resolved(config: Mapping[str, Any], engine: str, flags: Sequence[str]) -> ResolvedConfig:
    gpu, memory, preset = _platform(config)
    return resolve(
        engine,
        list(flags),
        gpu_memory_mib=memory,
        model_max_position_embeddings=preset.max_position_embeddings,
        gpu_name=gpu.name,
    )


def _logged_tokens(config: Mapping[str, Any], resolved: ResolvedConfig) -> int:
    gpu, memory, preset = _platform(config)
    capacity = kv_capacity(resolved, preset, gpu, memory)
    return int(runtime_limits(resolved, kv_capacity_tokens=capacity.tokens).kv_capacity_tokens)


def logged_kv_capacity(config: Mapping[str, Any], engine: str, flags: Sequence[str]) -> int:
    """The KV capacity in tokens `engine`, started with `flags` on the config's GPU and model,
    shows in its start-up log: its memory rule's (servelab.sim.run.kv_capacity) as the engine's
    run-time limits state it (SGLang's max_total_num_tokens, vLLM's GPU blocks x block size)."""
    return _logged_tokens(config, _resolved(config, engine, flags))


def _without(flags: Sequence[str], flag: str) -> list[str]:
    return [f for f in flags if f != flag and not f.startswith(f"{flag}=")]


def _value_of(flags: Sequence[str], flag: str) -> str | None:
    values = [f.split("=", 1)[1] for f in flags if f.startswith(f"{flag}=")]
    return values[-1] if values else None


def derive_memory_fraction(tokens_at: Callable[[str], int], target: int, *, what: str) -> str:
    """The memory fraction, as the flag's value, at which `tokens_at(value)` (the KV capacity an
    engine's memory rule gives for that fraction, nondecreasing in it) is exactly `target`: the
    middle of the interval of fractions that give it, with the fewest decimals that stay inside.
    ValueError when no fraction gives `target` (the nearest capacities are named)."""

    def at(fraction: float) -> int:
        try:
            return tokens_at(repr(fraction))
        except ResolutionError:
            raise
        except ValueError:  # the memory rule leaves nothing for the KV cache
            return 0

    def least(tokens: int) -> float:
        """The least fraction in (0, 1) whose capacity is >= tokens (to 1e-12)."""
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if at(mid) >= tokens else (mid, hi)
        return hi

    first, past = least(target), least(target + 1)
    if at(first) != target or past <= first:
        below, above = at(first - 1e-9), at(first)
        raise ValueError(
            f"{what}: no memory fraction gives a KV capacity of exactly {target} tokens "
            f"(the memory rule gives {below} and then {above})"
        )
    middle = (first + past) / 2
    for decimals in range(2, 16):
        value = f"{middle:.{decimals}f}"
        if first <= float(value) < past and tokens_at(value) == target:
            return value
    raise ValueError(f"{what}: no decimal fraction gives {target} tokens")  # pragma: no cover


def equalise_kv_capacity(
    config: dict[str, Any], tokens: int, tolerance: float
) -> tuple[dict[str, Any], ...]:
    """Give every (arm, engine) of `config` (validated) a KV capacity of `tokens` (in place): its
    memory-fraction flag derived from the engine's memory rule replaces the value in the engine's
    base flags and is added to the arm's flags, and the arm expects `kv_capacity_tokens`. Returns
    what was derived, with the default each value replaced."""
    derived = []
    base_flags = {name: list(spec["flags"]) for name, spec in config["engines"].items()}
    for engine, flags in base_flags.items():
        flag = engine_spec(engine).memory_fraction_flag
        if flag is None:
            raise ValueError(f"ablation.kv_capacity: {engine} has no memory-fraction flag")
        config["engines"][engine]["flags"] = _without(flags, flag)
    for arm in sorted(config["arms"]):
        for engine, espec in config["arms"][arm]["engines"].items():
            flag = engine_spec(engine).memory_fraction_flag
            assert flag is not None
            arm_flags = list(espec["flags"])
            before = [*base_flags[engine], *arm_flags]
            given = _value_of(before, flag)
            default_tokens = logged_kv_capacity(config, engine, before)
            # Resolved once: the fraction changes nothing else the engine resolves (both engines
            # only range-check it), so the search varies it alone; every derived value is then
            # resolved from its flags below.
            resolved = _resolved(config, engine, before)

            def tokens_at(value: str, resolved: ResolvedConfig = resolved) -> int:
                return _logged_tokens(
                    config, dataclasses.replace(resolved, memory_fraction=float(value))
                )

            value = derive_memory_fraction(tokens_at, tokens, what=f"arms.{arm}.engines.{engine}")
            espec["flags"] = [*_without(arm_flags, flag), f"{flag}={value}"]
            for condition in arm_conditions(config, arm, engine):
                deployed = deployment_for(config, arm, engine, condition).flags
                got = logged_kv_capacity(config, engine, deployed)
                if got != tokens:
                    raise ValueError(
                        f"arms.{arm}.engines.{engine}: the flags of {condition} give a KV capacity "
                        f"of {got} tokens at {flag}={value}, not {tokens}"
                    )
            espec["expect"] = {**espec["expect"], "kv_capacity_tokens": tokens}
            if tolerance:
                espec["expect"]["kv_capacity_tolerance"] = tolerance
            derived.append(
                {
                    "arm": arm,
                    "engine": engine,
                    "flag": flag,
                    "value": value,
                    "kv_capacity_tokens": tokens,
                    "default_value": given,
                    "default_kv_capacity_tokens": default_tokens,
                }
            )
    return tuple(derived)
