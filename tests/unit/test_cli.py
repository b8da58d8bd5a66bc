"""The `servelab` entry point: every registered subcommand is routed to the module that owns it."""

from __future__ import annotations

import argparse

from servelab import cli
from servelab.sim.server_cli import serve_main


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_every_registered_subcommand_is_mapped_to_its_module():
    assert _subcommands(cli.build_parser()) == set(cli.COMMANDS)
    for command, module in cli.COMMANDS.items():
        assert command in _subcommands(cli.build_parser(command)), (command, module)


def test_a_known_command_loads_only_its_own_module():
    assert _subcommands(cli.build_parser("resolve-config")) == {"resolve-config"}


def test_resolve_config_runs_through_main(repo, capsys):
    log = repo / "tests" / "data" / "engine-logs" / "vllm-0.6.2-chunked-off-01.log"
    assert cli.main(["resolve-config", str(log)]) == 0
    assert '"chunked_prefill": false' in capsys.readouterr().out


def test_serve_sim_is_registered_by_the_simulator_package():
    """`servelab serve-sim` parses as before and runs the simulator's server entry point."""
    parser = cli.build_parser("serve-sim")
    args = parser.parse_args(["serve-sim", "--engine", "sglang", "--flags=--x 1", "--port", "0"])
    assert args.func is serve_main
    assert (args.engine, args.flags, args.port) == ("sglang", "--x 1", 0)


def test_local_stop_runs_through_main(tmp_path, capsys):
    """`servelab local stop` (registered by the deploy package) on a folder that started nothing."""
    assert cli.main(["local", "stop", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "stopped: nothing was running"


def test_dispatch_reports_a_missing_trace_as_an_error(tmp_path, capsys):
    """`servelab dispatch` reaches the dispatcher: a trace folder without a trace is an error
    (exit 2, the reason on stderr), before any request is sent."""
    argv = ["dispatch", "--url", "http://127.0.0.1:9", "--trace", str(tmp_path)]
    assert cli.main([*argv, "--out", str(tmp_path / "out"), "--condition", "rate-0.28"]) == 2
    assert "servelab dispatch: error:" in capsys.readouterr().err
