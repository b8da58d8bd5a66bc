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
from collections.abc import Callable, Sequence
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


_TYPES: dict[str | None, Any] = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "nullable_str": _nullable_str,
    "nullable_kvs": _nullable_kvs,
    "json": _json,
}
# argparse names the type in "invalid <type> value" messages.
_nullable_kvs.__name__ = "nullable_kvs"
_json.__name__ = "json"


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
        kwargs["default"] = argparse.SUPPRESS if suppress_defaults else default
        if kind == "store":
            kwargs.update(type=_TYPES[tname], nargs=nargs, choices=choices)
        elif kind == "store_true":
            kwargs["action"] = "store_true"
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
