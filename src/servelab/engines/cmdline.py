"""Command lines parsed as an engine's own argument parser reads them, from its argument table.

The parsers are rebuilt from each engine's real argument definitions (`_cli_tables.py`, generated
from the engines' wheels by `_extract_cli.py`): the same option strings, actions, types, defaults
and choices, so `--enable-chunked-prefill` (vLLM's `StoreBoolean`, `nargs="?"`, `const="True"`),
`--enable-chunked-prefill=False`, `--max-num-batched-tokens 2048` and `--max-num-batched-tokens=2048`
all mean what they mean to the engine, and argparse's prefix matching (`--max-model 16384`) works
as it does there.

Flags the engine does not know are kept in `EngineFlags.unknown` and do not stop parsing; a known
flag with a bad value raises `FlagError` naming the flag, as the engine would refuse to start.
Engine-neutral: `servelab.engines.flags.parse_flags` looks the table up in the registry.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from servelab.engines.base import EngineFlags, FlagError

__all__ = ["parse_table"]

ArgTable = tuple[tuple[Any, ...], ...]


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise FlagError(f"{self.prog}: {message}")


def _nullable_str(value: str) -> str | None:
    """vLLM's `nullable_str`: an empty string or "None" is None."""
    return None if not value or value == "None" else value


def _nullable_kvs(value: str) -> dict[str, int] | None:
    """vLLM's `nullable_kvs`: "image=16,video=2" -> {"image": 16, "video": 2}."""
    if not value:
        return None
    out: dict[str, int] = {}
    for item in value.split(","):
        key, sep, num = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"Each item should be in the form KEY=VALUE: {item}")
        try:
            out[key] = int(num)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"Failed to parse value of item {item}") from exc
    return out


def _json(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from exc


def _human_readable_int(value: str) -> int:
    """vLLM V1's `human_readable_int`: "2048", "25.6k" (x1000), "2K" (x1024; no decimals)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        try:
            binary: int = 2 ** (10 * ("KMGT".index(suffix) + 1))
            return int(number) * binary
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}."
            ) from exc
    return int(value)


def _human_readable_int_or_auto(value: str) -> int:
    """vLLM V1's `human_readable_int_or_auto`: also "-1" or "auto" -> -1."""
    if value.strip() == "-1" or value.strip().lower() == "auto":
        return -1
    return _human_readable_int(value)


def _json_config(value: str) -> Any:
    """vLLM V1's config-dataclass JSON (`parse_dataclass`): parsed, not validated here."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', value)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(
            r"\b\d+(?:\.\d+)?[kKmMgGtT]\b", lambda m: str(_human_readable_int(m[0])), parts[i]
        )
    return _json("".join(parts))


def _dict_or_str(value: str) -> Any:
    """vLLM V1's `union_dict_and_str`: a JSON object if it looks like one, else the string."""
    if not re.match(r"(?s)^\s*{.*}\s*$", value):
        return value
    return None if value == "None" else _json(value)


def _reasoning_parser(value: str) -> str:
    """vLLM V1's `parse_reasoning_parser`: "none" (any case) -> ""."""
    return "" if value.lower() == "none" else value


def _lower_underscore(value: str) -> str:
    return value.lower().replace("-", "_")


def _device_ids(value: str) -> list[int | str]:
    parts = (part.strip() for part in value.split(","))
    return [int(p) if p.isdigit() else p for p in parts]


def _sglang_human_readable_int(value: str) -> int:
    """SGLang 0.5's `human_readable_int` (sglang/srt/utils/common.py at 0.5.23): SI k/M/G/T
    (x1000; decimals allowed) or IEC Ki/Mi/Gi/Ti (x1024; integers only), case-sensitive."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            iec: int = 2 ** (10 * ("KMGT".index(suffix[0]) + 1))
            return int(number) * iec
        return int(Decimal(number) * 10 ** (3 * ("kMGT".index(suffix) + 1)))
    try:
        return int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Invalid integer value: '{value}'.") from exc


def _cuda_graph_backend(value: str) -> str:
    """SGLang 0.5's `parse_cuda_graph_backend_arg` (model_executor/cuda_graph_config.py)."""
    if value == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return value


def _cuda_graph_config(value: str) -> dict[str, dict[str, Any]]:
    """SGLang 0.5's `parse_cuda_graph_config_arg`: a JSON object of phase (decode, prefill) to a
    settings object; the settings' keys are not checked here."""
    parsed = _json(value)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("--cuda-graph-config must be a JSON object")
    for phase, settings in parsed.items():
        if phase not in ("decode", "prefill"):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config: unknown phase '{phase}', expected one of "
                "('decode', 'prefill')"
            )
        if not isinstance(settings, dict):
            raise argparse.ArgumentTypeError(f"--cuda-graph-config['{phase}'] must be an object")
        if "backend" in settings:
            _cuda_graph_backend(str(settings["backend"]))
    return parsed


_TYPES: dict[str | None, Any] = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "nullable_str": _nullable_str,
    "nullable_kvs": _nullable_kvs,
    "json": _json,
    "json_config": _json_config,
    "dict_or_str": _dict_or_str,
    "human_readable_int": _human_readable_int,
    "human_readable_int_or_auto": _human_readable_int_or_auto,
    "reasoning_parser": _reasoning_parser,
    "lower_underscore": _lower_underscore,
    "device_ids": _device_ids,
    "sglang_human_readable_int": _sglang_human_readable_int,
    "json_list_type": _json,
    "parse_cuda_graph_backend_arg": _cuda_graph_backend,
    "parse_cuda_graph_config_arg": _cuda_graph_config,
}
# argparse names the type in "invalid <type> value" messages.
_nullable_kvs.__name__ = "nullable_kvs"
_json.__name__ = "json"
for _name, _fn in list(_TYPES.items()):
    if _name is not None and _fn not in (str, int, float, _json):
        _fn.__name__ = _name


def _optional(name: str, inner: Callable[[str], Any]) -> Callable[[str], Any]:
    """vLLM V1's `optional_type(T)`: "" or "None" -> None, else T(value)."""

    def convert(value: str) -> Any:
        return None if value in ("", "None") else inner(value)

    convert.__name__ = name
    return convert


for _name in ("int", "float", "json", "json_config", "human_readable_int"):
    _TYPES[f"optional_{_name}"] = _optional(f"optional_{_name}", _TYPES[_name])


class _StoreBoolean(argparse.Action):
    """vLLM's StoreBoolean: `--flag` (const "True"), `--flag=true|false` (any case)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        text = str(values).lower()
        if text == "true":
            setattr(namespace, self.dest, True)
        elif text == "false":
            setattr(namespace, self.dest, False)
        else:
            raise FlagError(
                f"{parser.prog}: argument {option_string}: Invalid boolean value: {values}. "
                "Expected 'true' or 'false'."
            )


class _EnableDisable(argparse.Action):
    """vLLM V1's EnableDisableAction (a BooleanOptionalAction): the table's `const` holds the
    negative option strings (`--no-enable-x`, `--disable-x`); any other of its strings sets True."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, option_string not in self.const)


class _DeprecatedStoreConst(argparse.Action):
    """SGLang 0.5's DeprecatedStoreTrueAction / DeprecatedStoreConstAction
    (arg_groups/argparse_actions.py): warns, then stores the table's `const` (True for the
    store-true form); the engine still starts."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, self.const)


class _LoRAPaths(argparse.Action):
    """SGLang's LoRAPathAction: NAME=PATH or PATH items into a dict."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        paths: dict[str, str] = {}
        for item in values:
            name, sep, path = item.partition("=")
            paths[name if sep else item] = path if sep else item
        setattr(namespace, self.dest, paths)


class _Deprecated(argparse.Action):
    """SGLang's DeprecatedAction: using the flag is an error."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        raise FlagError(
            f"{parser.prog}: argument {option_string}: deprecated, the engine refuses to start"
        )


def _build(engine: str, table: ArgTable, *, suppress_defaults: bool) -> _Parser:
    parser = _Parser(prog=engine, add_help=False)
    for strings, dest, kind, tname, default, nargs, const, choices in table:
        kwargs: dict[str, Any] = {"dest": dest}
        if default == argparse.SUPPRESS:  # the literal "==SUPPRESS==": argparse tests identity
            default = argparse.SUPPRESS
        kwargs["default"] = argparse.SUPPRESS if suppress_defaults else default
        if kind in ("store", "store_deprecated"):
            # store_deprecated: vLLM V1's DeprecatedLogConfigFileAction (warns, then stores).
            kwargs.update(type=_TYPES[tname], nargs=nargs, choices=choices)
            if const is not None:  # nargs="?" with a bare-flag value (vLLM V1 --hf-token)
                kwargs["const"] = const
        elif kind == "enable_disable":
            kwargs.update(action=_EnableDisable, nargs=0, const=tuple(const))
        elif kind == "store_true":
            kwargs["action"] = "store_true"
        elif kind == "boolean_optional":
            # SGLang 0.5: argparse.BooleanOptionalAction adds the `--no-` string itself.
            kwargs["action"] = argparse.BooleanOptionalAction
            strings = strings[:1]
        elif kind == "deprecated_store_true":
            kwargs.update(action=_DeprecatedStoreConst, nargs=0, const=True)
        elif kind == "deprecated_store_const":
            kwargs.update(action=_DeprecatedStoreConst, nargs=nargs, const=const, choices=choices)
        elif kind == "store_boolean":
            kwargs.update(action=_StoreBoolean, nargs=nargs, const=const)
        elif kind == "append":
            kwargs.update(action="append", type=_TYPES[tname])
            if not suppress_defaults:
                kwargs["default"] = list(default)
        elif kind == "list":
            kwargs.update(type=_TYPES[tname], nargs=nargs)
        elif kind == "lora_paths":
            kwargs.update(action=_LoRAPaths, nargs=nargs)
        elif kind == "deprecated":
            kwargs.update(action=_Deprecated, nargs=0)
        else:  # pragma: no cover - the table is generated
            raise AssertionError(f"unknown action kind {kind!r}")
        if not strings:  # a positional (vLLM V1's model_tag): named by its dest
            parser.add_argument(kwargs.pop("dest"), **kwargs)
        else:
            parser.add_argument(*strings, **kwargs)
    return parser


def parse_table(
    engine: str,
    table: ArgTable,
    flags: Sequence[str],
    *,
    normalise: Callable[[Sequence[str]], list[str]] | None = None,
    required: Sequence[tuple[str, str]] = (),
) -> EngineFlags:
    """Parse `flags` with the argument `table` of `engine` (see `parse_flags`)."""
    if isinstance(flags, str):
        raise FlagError(f"{engine}: flags must be a list of strings, got one string {flags!r}")
    tokens = [str(t) for t in flags]
    if normalise is not None:
        tokens = normalise(tokens)
    try:
        full, unknown = _build(engine, table, suppress_defaults=False).parse_known_args(tokens)
        explicit, _ = _build(engine, table, suppress_defaults=True).parse_known_args(tokens)
    except argparse.ArgumentError as exc:  # pragma: no cover - error() raises first
        raise FlagError(f"{engine}: {exc}") from exc
    args = vars(full)
    for dest, option in required:
        if args.get(dest) is None:
            raise FlagError(f"{engine}: the following arguments are required: {option}")
    return EngineFlags(
        engine=engine,
        flags=tuple(str(t) for t in flags),
        args=MappingProxyType(dict(args)),
        given=frozenset(vars(explicit)),
        unknown=tuple(unknown),
    )
