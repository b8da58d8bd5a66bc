"""The `servelab` entry point: every registered subcommand is routed to the module that owns it."""

from __future__ import annotations

import argparse

from servelab import cli


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
