"""Maintenance tool: generate `src/servelab/engines/_cli_tables_sglang_v05.py` from sglang 0.5.23.

Not imported by servelab. From 0.5.x on, SGLang no longer spells its flags out as
`parser.add_argument` calls in `sglang/srt/server_args.py`: the fields are declared as annotated
`msgspec.Struct` namespaces in `sglang/srt/arg_groups/fields/*.py`, `server_args.py` assembles
`ServerArgs` from them with `msgspec.defstruct`, and `ServerArgs.add_cli_args` registers them via
`sglang/srt/arg_groups/arg_utils.py::add_cli_args_from_dataclass` plus a few manual
`add_argument` calls (dynamic choices, `--config`, deprecated flags). So, like `_extract_cli.py`,
this tool runs the engine's own code without importing torch: a meta-path finder imports only
the argument-declaring modules for real (`server_args`, `arg_groups.{arg_utils, argparse_actions,
choices, field_order, fields.*}`, `environ`, `model_executor.cuda_graph_config`, the parser-name
lists and `kernels/ops/kv_canary/consts.py`); every other `sglang.*` module becomes a stand-in
whose top-level functions are named no-ops and whose literal constants are the real ones (read
with `ast.literal_eval`), packages are not initialised, and third-party modules (torch, ...)
are `MagicMock`s. The real argparse actions are then described. Needs only `msgspec` (a
dependency of sglang 0.5.x) besides the standard library; Python >= 3.11 (the wheel's floor).

Set-valued choices (`--sampling-backend` builds a `set`) are sorted so the table is stable.

Reproduce (sha256 of the wheel: 00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937):

    pip download --no-deps sglang==0.5.23 -d DL
    sha256sum DL/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
    unzip -q DL/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl 'sglang/*' -d SGLANG_DIR
    python3.11 -m venv VENV && VENV/bin/pip install msgspec      # 0.23.0 was used
    VENV/bin/python tools/extract_cli_sglang_v05.py SGLANG_DIR > src/servelab/engines/_cli_tables_sglang_v05.py
    ruff format src/servelab/engines/_cli_tables_sglang_v05.py
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib.abc
import importlib.machinery
import os
import pprint
import sys
import types
from pathlib import Path
from typing import Any
from unittest import mock

# sglang modules executed for real (prefix match on the dotted name).
_REAL = (
    "sglang.srt.server_args",
    "sglang.srt.arg_groups.arg_utils",
    "sglang.srt.arg_groups.argparse_actions",
    "sglang.srt.arg_groups.choices",
    "sglang.srt.arg_groups.field_order",
    "sglang.srt.arg_groups.fields",
    "sglang.srt.environ",
    "sglang.srt.model_executor.cuda_graph_config",
    "sglang.srt.parser.reasoning_parser_names",
    "sglang.srt.function_call.parser_names",
    "sglang.kernels.ops.kv_canary.consts",
)


def _is_real(name: str) -> bool:
    return any(name == r or name.startswith(r + ".") for r in _REAL)


def _standin_module(name: str, path: Path | None) -> types.ModuleType:
    """A module whose attributes are MagicMocks, except named function stand-ins and literals."""

    class _Mod(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            value = mock.MagicMock(name=f"{name}.{attr}")
            setattr(self, attr, value)
            return value

    mod = _Mod(name)
    if path is not None and path.is_file():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):

                def _fn(*a: Any, **k: Any) -> None:
                    return None

                _fn.__name__ = _fn.__qualname__ = node.name
                setattr(mod, node.name, _fn)
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                try:
                    value = ast.literal_eval(node.value)
                except (ValueError, SyntaxError, TypeError):
                    continue
                for t in targets:
                    if isinstance(t, ast.Name):
                        setattr(mod, t.id, value)
    return mod


class _Loader(importlib.abc.Loader):
    def __init__(self, build: Any) -> None:
        self._build = build

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._build(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        top = name.split(".")[0]
        if top == "sglang":
            if _is_real(name):
                return None  # the normal path finder loads it from the wheel
            rel = self.root.joinpath(*name.split("."))
            if rel.is_dir():  # package: importable submodules, __init__ not run

                def _pkg(spec: Any, rel: Path = rel) -> types.ModuleType:
                    mod = _standin_module(spec.name, None)
                    mod.__path__ = [str(rel)]
                    return mod

                return importlib.machinery.ModuleSpec(name, _Loader(_pkg), is_package=True)
            src = rel.with_suffix(".py")
            return importlib.machinery.ModuleSpec(
                name, _Loader(lambda spec: _standin_module(spec.name, src))
            )
        if top == "msgspec" or top in sys.stdlib_module_names:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                if finder.find_spec(name, path, target) is not None:
                    return None
            except Exception:
                continue

        def _third_party(spec: Any) -> types.ModuleType:
            mod = mock.MagicMock(name=spec.name)
            mod.__name__, mod.__path__, mod.__spec__ = spec.name, [], spec
            mod.__version__ = "0.0.0"
            return mod

        return importlib.machinery.ModuleSpec(name, _Loader(_third_party), is_package=True)


def _load_server_args(root: Path) -> Any:
    sys.path.insert(0, str(root))
    sys.meta_path.insert(0, _Finder(root))
    import importlib

    return importlib.import_module("sglang.srt.server_args")


_KINDS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "BooleanOptionalAction": "boolean_optional",
    "LoRAPathAction": "lora_paths",
    "DeprecatedAction": "deprecated",
    "DeprecatedStoreTrueAction": "deprecated_store_true",
    "DeprecatedStoreConstAction": "deprecated_store_const",
    "DeprecatedAliasStoreAction": "deprecated_alias_store",
}


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise SystemExit(f"not a plain literal: {value!r}")


# SGLang value types whose name vLLM's tables also use with other rules: SGLang's
# human_readable_int (utils/common.py) takes k/M/G/T (x1000, decimals) and Ki/Mi/Gi/Ti (x1024),
# vLLM's k (x1000) and K (x1024).
_SGLANG_TYPES = ("human_readable_int",)


def _describe(parser: argparse.ArgumentParser) -> list[tuple[Any, ...]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = _KINDS.get(type(action).__name__)
        if kind is None:
            raise SystemExit(f"unknown action {type(action).__name__} for {action.dest}")
        tname = getattr(action.type, "__name__", None) if action.type else None
        if action.type is not None and tname is None:
            raise SystemExit(f"unnamed type for {action.dest}: {action.type!r}")
        if tname == "loads":  # json.loads, as in _extract_cli.py
            tname = "json"
        if tname in _SGLANG_TYPES:  # same name as a vLLM type, other rules (cmdline.py)
            tname = "sglang_" + tname
        choices = action.choices
        if choices is not None:
            if isinstance(choices, set | frozenset):
                choices = sorted(choices, key=str)
            choices = tuple(_plain(c) for c in choices)
        default = action.default
        if isinstance(default, mock.Mock):
            raise SystemExit(f"unresolved default for {action.dest}")
        const = action.const
        if kind == "deprecated_store_const":
            const = action.const_value  # written to dest when the flag is given
        out.append(
            (
                tuple(action.option_strings),
                action.dest,
                kind,
                tname,
                _plain(default),
                action.nargs,
                _plain(const),
                choices,
            )
        )
    return out


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    os.environ.pop("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", None)
    sa = _load_server_args(root)
    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    fields = tuple(f.name for f in sa.record_fields(sa.ServerArgs))
    third_party = sorted(
        n for n, m in sys.modules.items() if isinstance(m, mock.Mock) and "." not in n
    )
    print(f"# stand-ins for third-party modules: {third_party}", file=sys.stderr)

    print(
        '"""Generated by `tools/extract_cli_sglang_v05.py` from sglang 0.5.23: do not edit by hand.'
    )
    print()
    print("Each entry: (option strings, dest, kind, type, default, nargs, const, choices), in")
    print("`ServerArgs.add_cli_args` order (sglang/srt/server_args.py, arg_groups/arg_utils.py).")
    print("Kinds beyond `_cli_tables.py`: `deprecated_store_true` (warns, stores True),")
    print("`deprecated_store_const` (warns, stores `const`; nargs as given), `boolean_optional`")
    print(
        "(argparse.BooleanOptionalAction). Types beyond it: sglang_human_readable_int, json_list_type,"
    )
    print("parse_cuda_graph_backend_arg, parse_cuda_graph_config_arg. Set-valued choices sorted.")
    print('"""')
    print()
    print("# SGLang 0.5.23: python -m sglang.launch_server (ServerArgs.add_cli_args).")
    print("SGLANG_0_5_23 = " + pprint.pformat(tuple(_describe(parser)), width=100))
    print()
    print("# SGLang 0.5.23: ServerArgs fields in declaration order (the order of its repr,")
    print("# which skips watermark_key, watermark_key_b and watermark_config).")
    print("SGLANG_0_5_23_SERVER_ARGS_FIELDS = " + pprint.pformat(fields, width=100))


if __name__ == "__main__":
    main(sys.argv[1:])
