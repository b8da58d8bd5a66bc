"""servelab's llama-server flag table (servelab.engines.llamacpp.FLAG_TABLE) against the real
binary's own --help: every spelling, boolean pair and integer default."""

from __future__ import annotations

import re
import subprocess

from servelab.engines import llamacpp

# ------------------------------------------------------------------ the table vs the real binary


def test_the_flag_table_matches_the_real_binarys_help(llama_server_program: str) -> None:
    done = subprocess.run(
        [llama_server_program, "--help"], capture_output=True, text=True, timeout=60
    )
    # option spellings (at the start of a help line, comma-separated) -> that option's help text
    spellings: dict[str, str] = {}
    current: list[str] = []
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("-"):
            current = re.findall(r"(?:^|,\s+)(-[\w-]+)", line)
            for option in current:
                spellings[option] = line
        else:
            for option in current:
                spellings[option] += " " + line.strip()
    for strings, dest, kind, _type, default, *_ in llamacpp.FLAG_TABLE:
        for option in strings:
            assert option in spellings, option
        if kind == "store_boolean":
            pair = [s for s, (o, _) in llamacpp._BOOL_SPELLINGS.items() if o == strings[0]]
            block = spellings[strings[0]]
            assert all(s in block for s in pair), pair
            if m := re.search(r"default: (enabled|disabled)\)", block):
                assert default == (m.group(1) == "enabled"), dest
        elif isinstance(default, int) and not isinstance(default, bool):
            m = re.search(r"default: (-?\d+)", spellings[strings[0]])
            if m:
                assert int(m.group(1)) == default, dest
