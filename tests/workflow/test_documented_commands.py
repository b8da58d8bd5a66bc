"""Every command that README.md, docs/ and the config comments show is run, in a safe form.

The docs are read when the tests run, so a command added or edited there is checked from then on.
A command is a line of any fence but a code or data one (python, yaml, json, ...) or an inline code
span, whose first word is a known program (KNOWN_PROGRAMS) or a script of this repository; `a && b`,
`a; b` and `a | b` are several. Each runs in a scratch copy of the checkout (nothing is written to
the checkout itself):

- `snakemake ...`       as a dry run (`-n` added), exactly as written otherwise; `--report` for real,
                        in a copy of the session's tiny campaign;
- `servelab ...`        for real when quick and its inputs can be made here (REAL_SUBCOMMANDS; the
                        ones that read a campaign in the tiny campaign's copy), else
                        `servelab <subcommand> --help`, which must list every option shown (so
                        is one with an option that acts on a cluster, CLUSTER_OPTIONS);
- `make TARGET`         as `make -n TARGET`;
- `python|pytest ...`   with `--help`, which must list every option shown;
- `tar ...`             for real, on the tiny campaign's bundle;
- a repository script   a Python one with `--help`, which must list every option shown; a shell
                        one through `bash -n`, and every option shown must be in its text;
- anything else         only if NOT_RUN names it, with the reason; shell blocks also pass `bash -n`.

A documented command that fails in its safe form fails its test, and so does a command of a known
program that no rule runs and NOT_RUN does not name.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from forked_runs import run_forked

# The module's fixture is one costly set-up: every test of it on one xdist worker, so that the
# two workers do not each build it.
pytestmark = pytest.mark.xdist_group("documented-commands")

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TIMEOUT_S = 300
# Two at a time: most of each run is Python start-up and imports, and CI has two cores.
WORKERS = 2

# The programs whose lines and inline spans count as commands (as do the repository's scripts).
# The first row is run by a rule below; the others only under a NOT_RUN entry, each with its reason.
RUN_PROGRAMS = ("snakemake", "servelab", "make", "python", "python3", "pytest", "tar")
OTHER_PROGRAMS = (
    *("git", "gcloud", "helm", "kubectl", "docker", "apt-get", "pip", "uv", "hf", "less"),
    *("vllm", "sglang", "aiperf", "inference-perf", "cyclictest", "curl", "taskset"),
)
KNOWN_PROGRAMS = frozenset(RUN_PROGRAMS + OTHER_PROGRAMS)
SHELL_FENCES = frozenset({"sh", "bash", "shell", "console"})
# Any other fence ("", text, ...) may mix commands with output, diagrams or synopses.
CODE_FENCES = frozenset({"python", "py", "yaml", "yml", "json", "toml", "ini", "jinja", "promql"})

# Commands shown in the docs that no test runs, not even as a dry run: each with its reason. Each
# entry must still match a documented command, and every other command is run.
NOT_RUN: dict[str, str] = {
    "gcloud": "creates, configures and deletes a billed GKE cluster",
    "helm": "installs the monitoring stack into a real cluster",
    "kubectl": "acts on a real cluster (namespace, Secret, logs, teardown)",
    "docker": "asks a container registry for an image digest (no registry is reachable here)",
    "git": "clones or checks out a user's copy (the address and commit are placeholders)",
    "apt-get": "installs a system package as root; .ci/run does it (tests/unit/test_ci_run.py)",
    "pip download": "downloads an engine's wheel (hundreds of MB) to read its source",
    "pip install": "installs into an environment; `make`'s own set-up runs it on every machine",
    "python3 -m vllm.entrypoints.openai.api_server": "vLLM's server, in its own image",
    "uv pip compile": "resolves against PyPI; tools/lock-verify-env.sh runs it (a network lock)",
    "hf": "fetches from a model hub, which servelab never does at run time",
    "less": "a pager: it reads the terminal",
    "vllm": "vLLM's own command line, quoted for what it does (its peer check is a benchmark)",
    "sglang": "SGLang's own command line, quoted for what it does",
    "python3 -m sglang.launch_server": "SGLang's server, in its own image on a GPU node",
    "aiperf": "a peer tool in a venv of its own (docs/benchmarks/llamacpp.md builds it)",
    # `.`, `read`, `unset`, NAME=value ...: see _normalized
    "(shell)": "changes only the calling shell's state (its block is still checked by `bash -n`)",
    "python -m servelab.engines._extract_cli": "reads the unpacked vLLM and SGLang wheels",
}
SHELL_BUILTINS = frozenset({".", "source", "read", "unset", "export", "cd"})

# servelab subcommands run for real: each takes seconds on the inputs below. Those that read a
# campaign's results run in a copy of the session's tiny campaign.
REAL_SUBCOMMANDS = frozenset(
    {
        ("trace", "compile"),
        ("trace", "validate"),
        ("trace", "show"),
        ("resolve-config",),
        ("local", "stop"),
    }
)
CAMPAIGN_SUBCOMMANDS = frozenset(
    {("table", "show"), ("campaign", "plan"), ("campaign", "status"), ("bundle",), ("verify",)}
)
# Options that make a servelab command act on a real cluster: shown as `--help` whatever the
# subcommand (`servelab campaign status --cluster` reads a submitted Job, not a results folder).
CLUSTER_OPTIONS = frozenset({"--cluster"})
# Inputs the docs refer to by a path that only a user's campaign would have: made in the scratch copy
# (a path under results/ is taken from the tiny campaign).
DOCUMENTED_INPUTS = {
    "path/to/engine-startup.log": REPO / "tests" / "data" / "engine-logs" / "sglang-0.4.1-01.log",
    "path/to/bundle.tar.gz": Path("results/bundle.tar.gz"),
}
PLACEHOLDER = re.compile(r"[<>\[\]|]|\.\.\.|^[A-Z][A-Z0-9_]*$|^/")
OPTION = re.compile(r"^\[?(--[a-z][a-z0-9-]*)")


# ------------------------------------------------------------------------------------ extraction
@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str  # as shown, continuation lines joined, without a `$ ` prompt
    argv: tuple[str, ...]  # one command of `text`, as the shell splits it
    inline: bool = False  # an inline code span in prose: often a fragment of a full command


def commands_of(where: str, text: str, *, inline: bool = False) -> list[DocCommand]:
    """`a && b; c | d` on one line is four commands; a line the shell cannot split is one bad one."""
    try:
        # a markdown table escapes `|` as `\\|`
        words = shlex.split(text.replace("\\|", "|"), comments=True)
    except ValueError as error:
        return [DocCommand(where, text, ("<unparsable>", str(error)), inline)]
    found: list[DocCommand] = []
    current: list[str] = []
    for word in words:
        ends_command = word in ("&&", "||", "|", ";") or word.endswith(";")
        word = word.removesuffix(";") if word not in ("&&", "||", "|") else ""
        if word:
            current.append(word)
        if ends_command and current:
            found.append(DocCommand(where, text, tuple(current), inline))
            current = []
    if current:
        found.append(DocCommand(where, text, tuple(current), inline))
    return found


@dataclass(frozen=True)
class ShellBlock:
    where: str
    text: str


def _joined_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Lines with their `\\` continuations folded in, numbered by their first line."""
    start, parts = 0, []
    for number, line in lines:
        if not parts:
            start = number
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1].rstrip())
            continue
        parts.append(line.strip() if parts else line.rstrip())
        yield start, " ".join(parts).strip()
        parts = []
    if parts:
        yield start, " ".join(parts).strip()


ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


def program_of(word: str) -> str:
    """The program a command's first word names: `.venv/bin/python` and `~/v/bin/pip` are python
    and pip; a repository script keeps its path."""
    return word.rpartition("/bin/")[2] if "/bin/" in word else word


def repo_script(word: str) -> Path | None:
    """The repository file a command's first word runs (`tools/x.sh`, `benchmarks/y.py`), if any."""
    if "/" not in word or word.startswith(("/", "~", "$")) or ".." in word:
        return None
    path = REPO / word
    if not path.is_file() or not (path.suffix in (".py", ".sh") or os.access(path, os.X_OK)):
        return None
    return path


def _is_command(text: str) -> bool:
    words = text.split()
    while words and ASSIGNMENT.match(words[0]):  # `UPDATE_GOLDENS=1 pytest ...`
        words = words[1:]
    if len(words) < 2:  # a bare program name is prose, not a command
        return False
    if (
        words[1].endswith(":") or words[1] == "="
    ):  # `vllm 0.12.0: ...`, `sglang = ...`: not commands
        return False
    return program_of(words[0]) in KNOWN_PROGRAMS or repo_script(words[0]) is not None


def extract_markdown(text: str, name: str) -> tuple[list[DocCommand], list[ShellBlock]]:
    """The commands shown in a markdown text, and its shell-labelled fenced blocks."""
    commands: list[DocCommand] = []
    blocks: list[ShellBlock] = []
    fence: str | None = None
    lang = ""
    body: list[tuple[int, str]] = []
    paragraph: list[tuple[int, str]] = []  # prose, where an inline code span may wrap a line
    for number, line in enumerate([*text.splitlines(), ""], start=1):
        opening = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence is None and (opening or not line.strip()):
            commands += _inline_commands(paragraph, name)
            paragraph = []
        if fence is None and opening:
            fence, lang, body = opening.group(1), opening.group(2).lower(), []
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                commands += _fenced_commands(body, lang, name)
                if lang in SHELL_FENCES - {"console"}:
                    blocks.append(
                        ShellBlock(f"{name}:{body[0][0] if body else number}", _text(body))
                    )
                fence = None
            else:
                body.append((number, line))
            continue
        paragraph.append((number, line))
    return commands, blocks


def _inline_commands(paragraph: list[tuple[int, str]], name: str) -> list[DocCommand]:
    if not paragraph:
        return []
    text = "\n".join(line for _, line in paragraph)
    found = []
    for match in re.finditer(r"`([^`]+)`", text):
        span = " ".join(match.group(1).split()).removeprefix("$ ")
        if _is_command(span):
            number = paragraph[0][0] + text.count("\n", 0, match.start())
            found += commands_of(f"{name}:{number}", span, inline=True)
    return found


def _text(body: list[tuple[int, str]]) -> str:
    return "\n".join(line for _, line in body) + "\n"


def _fenced_commands(body: list[tuple[int, str]], lang: str, name: str) -> list[DocCommand]:
    if lang in CODE_FENCES:
        return []  # code and data, not commands
    found = []
    for number, line in _joined_lines(body):
        prompted = line.startswith("$ ")
        text = line.removeprefix("$ ").strip()
        if not text or text.startswith("#"):
            continue
        if lang == "console" and not prompted:
            continue  # console output
        if lang in SHELL_FENCES or _is_command(text):
            found += commands_of(f"{name}:{number}", text)
    return found


def extract_config_comments(text: str, name: str) -> list[DocCommand]:
    """Commands a config file's comments tell the reader to run (`# Use with: snakemake ...`)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.match(r"^\s*#\s*(?:[A-Z][\w ]*:\s*)?((?:snakemake|servelab|make)\s.*)$", line)
        if match:
            found += commands_of(f"{name}:{number}", match.group(1).strip())
    return found


# The ablations' overlays (docs/ablations.md): their comments' commands are run too, and each
# ablation must have a documented dry run.
ABLATIONS = REPO / "config" / "ablations"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def documented() -> tuple[list[DocCommand], list[ShellBlock]]:
    commands: list[DocCommand] = []
    blocks: list[ShellBlock] = []
    for path in doc_files():
        found, shell_blocks = extract_markdown(path.read_text(), str(path.relative_to(REPO)))
        commands += found
        blocks += shell_blocks
    for path in [*sorted((REPO / "config").glob("*.yaml")), *sorted(ABLATIONS.glob("*.yaml"))]:
        commands += extract_config_comments(path.read_text(), str(path.relative_to(REPO)))
    return commands, blocks


# ------------------------------------------------------------------------------------- planning
Kind = Literal["dry run", "run", "campaign run", "help", "make -n", "script", "not run", "no rule"]


@dataclass(frozen=True)
class Plan:
    """What a documented command is run as: `run` in the scratch checkout, `campaign run` in the
    tiny campaign's copy, the others in the clean checkout."""

    kind: Kind
    argv: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # the documented options the output (help, script) must list
    reason: str = ""  # for "not run"


def _normalized(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The command without leading `NAME=value` words, its program as `program_of` names it; a
    shell builtin, or assignments alone, as `(shell)`."""
    words = list(argv)
    while words and ASSIGNMENT.match(words[0]):
        words.pop(0)
    if not words or words[0] in SHELL_BUILTINS:
        return ("(shell)", *argv[1:])
    return (program_of(words[0]), *words[1:])


def not_run_reason(argv: tuple[str, ...]) -> str | None:
    line = " ".join(_normalized(argv)) + " "
    for prefix, reason in NOT_RUN.items():
        if line.startswith(prefix + " "):
            return reason
    return None


def _options(args: Iterable[str]) -> tuple[str, ...]:
    return tuple(m.group(1) for m in map(OPTION.match, args) if m)


def _subcommands(args: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The subcommand path(s) of `servelab ARGS`: `sim deploy|run` is two."""
    path: list[list[str]] = [[]]
    for arg in args:
        if not re.fullmatch(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*", arg):
            break
        path = [[*p, alt] for p in path for alt in arg.split("|")]
    return [tuple(p) for p in path]


def _python_help(launcher: tuple[str, ...], args: tuple[str, ...]) -> Plan:
    if args[:1] == ("-m",):
        launcher, args = (*launcher, "-m", args[1]), args[2:]
    # keep the script or test folder; drop values that would only be read after --help
    kept = tuple(a for a in args if not a.startswith("-") and (REPO / a).exists())
    return Plan("help", (*launcher, *kept, "--help"), _options(args))


def plan(command: DocCommand) -> list[Plan]:
    reason = not_run_reason(command.argv)
    if reason is not None:
        return [Plan("not run", reason=reason)]
    program, *rest = _normalized(command.argv)
    args = tuple(rest)
    concrete = not any(PLACEHOLDER.search(arg) for arg in args)
    if program == "snakemake":
        if "--report" in args:  # for real, after a campaign: a dry run makes no report
            return [Plan("campaign run", (str(BIN / "snakemake"), *args))]
        if args[:1] in (("--cores",), ("-c",)) and args[1:2] and args[1].isdigit():
            # a dry run starts no job, so a leading core count is moot (and only a leading one
            # is dropped: anywhere else it may end the file list of a --configfile before it)
            args = args[2:]
        dry = () if "-n" in args or "--dry-run" in args else ("-n",)
        return [Plan("dry run", (str(BIN / "snakemake"), *dry, *args))]
    if program == "make":
        return [Plan("make -n", ("make", "-n", *args))]
    if program == "servelab":
        paths = _subcommands(args)
        on_cluster = bool(CLUSTER_OPTIONS & set(args))
        if concrete and not command.inline and len(paths) == 1 and not on_cluster:
            if paths[0] in REAL_SUBCOMMANDS:
                return [Plan("run", (str(BIN / "servelab"), *args))]
            if paths[0] in CAMPAIGN_SUBCOMMANDS:
                return [Plan("campaign run", (str(BIN / "servelab"), *args))]
        return [
            Plan("help", (str(BIN / "servelab"), *path, "--help"), _options(args)) for path in paths
        ]
    if program in ("python", "python3"):
        return [_python_help((sys.executable,), args)]
    if program == "pytest":
        return [_python_help((sys.executable, "-m", "pytest"), args)]
    if program == "tar" and concrete and not command.inline:
        return [Plan("campaign run", ("tar", *args))]
    script = repo_script(program)
    if script is not None and script.suffix == ".py":
        return [Plan("help", (sys.executable, str(script), "--help"), _options(args))]
    if script is not None:  # a shell script: valid shell, and its text knows every option shown
        check = 'bash -n "$0" && cat "$0"'
        return [Plan("script", ("bash", "-c", check, str(script)), _options(args))]
    return [Plan("no rule", reason=f"no rule runs `{program}`: add one, or a NOT_RUN entry")]


# ------------------------------------------------------------------------------------ execution
@dataclass
class Outcome:
    plan: Plan
    ok: bool
    detail: str = ""


@dataclass
class Runner:
    """Runs plans in scratch copies of the checkout: the dry runs, `--help` and `make -n` in one
    left as a clean clone has it, the real runs (which write results/) in another, and the runs that
    read a campaign in a copy of the tiny campaign."""

    clean: Path
    real: Path
    campaign: Path
    # one run per distinct argv: the docs show some commands several times
    results: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def _run(self, argv: tuple[str, ...], cwd: Path) -> None:
        if argv in self.results:
            return
        try:
            result = subprocess.run(
                argv, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:  # that command's failure only
            result = subprocess.CompletedProcess(argv, -1, "", f"{type(error).__name__}: {error}")
        self.results[argv] = result

    def _run_in_order(self, argvs: Iterable[tuple[str, ...]], cwd: Path) -> None:
        for argv in argvs:
            self._run(argv, cwd)

    def _run_forked(self, argvs: Iterable[tuple[str, ...]], cwd: Path) -> None:
        """Python commands, each in a fork of one interpreter that has imported their common
        dependencies once (tests/forked_runs.py): a fresh interpreter's imports are most of each."""
        todo = [argv for argv in dict.fromkeys(argvs) if argv not in self.results]
        jobs = [(cwd, argv) for argv in todo]
        results = run_forked(jobs, interpreter=sys.executable, timeout_s=TIMEOUT_S)
        for argv, result in zip(todo, results, strict=True):
            self.results[argv] = result

    def _make_inputs(self) -> None:
        for folder in (self.real, self.campaign):
            for target, source in DOCUMENTED_INPUTS.items():
                origin = source if source.is_absolute() else self.campaign / source
                if origin.is_file():
                    (folder / target).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(origin, folder / target)

    def outcome(self, plan: Plan) -> Outcome:
        if plan.kind in ("not run", "no rule"):
            return Outcome(plan, plan.kind == "not run", plan.reason)
        result = self.results[plan.argv]
        output = result.stdout + result.stderr
        tail = "\n".join(output.strip().splitlines()[-15:])
        if result.returncode != 0:
            return Outcome(
                plan, False, f"exit {result.returncode}: {shlex.join(plan.argv)}\n{tail}"
            )
        missing = [o for o in plan.options if not re.search(rf"(?<![\w-]){o}(?![\w-])", output)]
        if missing:
            return Outcome(plan, False, f"{shlex.join(plan.argv)} does not list {missing}")
        return Outcome(plan, True)

    def run_all(self, commands: list[DocCommand]) -> dict[DocCommand, list[Outcome]]:
        plans = {command: plan(command) for command in commands}
        every = [p for ps in plans.values() for p in ps]
        self._make_inputs()
        batched = [p for p in every if _batchable(p)]
        targets = dict.fromkeys(a for p in batched for a in _targets(p))
        batch = (str(BIN / "snakemake"), "-n", *targets)
        # `trace compile` first: the other trace commands read the trace it writes
        real = sorted((p for p in every if p.kind == "run"), key=lambda p: "compile" not in p.argv)
        in_campaign = [p.argv for p in every if p.kind == "campaign run"]
        forked = [p.argv for p in every if _forkable(p) and p not in batched]
        rest = [
            p
            for p in every
            if p.kind in ("dry run", "help", "make -n", "script")
            and p not in batched
            and not _forkable(p)
        ]
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            jobs = [
                pool.submit(self._run_in_order, [p.argv for p in real], self.real),
                pool.submit(self._run_in_order, in_campaign, self.campaign),
            ]
            if batched:
                jobs.append(pool.submit(self._run, batch, self.clean))
            jobs.append(pool.submit(self._run_forked, forked, self.clean))
            # the snakemake dry runs (seconds each) before the quick --help and make -n
            slow_first = dict.fromkeys(
                p.argv for p in sorted(rest, key=lambda p: p.kind != "dry run")
            )
            jobs += [pool.submit(self._run, argv, self.clean) for argv in slow_first]
            for job in jobs:
                job.result()
            batch_passed = bool(batched) and self.results[batch].returncode == 0
            if not batch_passed:  # find which of them fails
                again = {p.argv for p in batched}
                for job in [pool.submit(self._run, argv, self.clean) for argv in again]:
                    job.result()
        return {
            command: [
                Outcome(p, True, "in one batched dry run")
                if batch_passed and p in batched
                else self.outcome(p)
                for p in ps
            ]
            for command, ps in plans.items()
        }


def _forkable(plan: Plan) -> bool:
    """A command `Runner._run_forked` runs: the --help of a Python script (`python SCRIPT ...
    --help`) or of a `servelab` subcommand. Not a `snakemake` dry run: forked after Snakemake's
    import, it logs more than it does alone (its logging is set up at import), so it runs alone."""
    argv = plan.argv
    if plan.kind != "help" or len(argv) < 2:
        return False
    if argv[0] == sys.executable:
        return argv[1].endswith(".py")
    return argv[0] == str(BIN / "servelab")


def _targets(plan: Plan) -> list[str]:
    args = plan.argv[1:]
    return [
        a
        for i, a in enumerate(args)
        if not a.startswith("-") and (i == 0 or args[i - 1] not in ("--cores", "-c"))
    ]


def _batchable(plan: Plan) -> bool:
    """A default-config dry run: targets and --cores only, so several can share one run."""
    if plan.kind != "dry run":
        return False
    args = list(plan.argv[1:])
    while args:
        arg = args.pop(0)
        if arg in ("--cores", "-c") and args and args[0].isdigit():
            args.pop(0)
        elif arg.startswith("-") and arg not in ("-n", "--dry-run"):
            return False
    return True


def scratch_copy(dest: Path) -> Path:
    """The checkout as a clean clone has it: no results, no venv, no Snakemake state."""
    skip = {
        ".git",
        ".venv",
        ".venv-verify",
        ".snakemake",
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
    }

    def ignore(folder: str, names: list[str]) -> set[str]:
        here = Path(folder).resolve()
        ignored = {n for n in names if n in skip or n.endswith(".egg-info")}
        if here == REPO:
            ignored |= {"results", "report.html", "logs"}
        return ignored

    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    (dest / "results").mkdir(exist_ok=True)
    # docs/kubernetes.md: copy the example to an untracked config/kubernetes.yaml, then run
    kube = dest / "config" / "kubernetes.yaml"
    if not kube.exists():
        shutil.copy(dest / "config" / "kubernetes.example.yaml", kube)
    return dest


COMMANDS, SHELL_BLOCKS = documented()


def campaign_copy(tiny_campaign, dest: Path) -> Path:
    """The tiny campaign (its config as config/config.yaml) in a checkout of its own: the
    workflow's files and the repository's other configs beside it, so that a documented
    `snakemake` finds its Snakefile and `--configfile config/X.yaml` its file."""
    copy = tiny_campaign.copy_to(dest).path
    for name in ("Snakefile", "environment.yml"):
        shutil.copy(REPO / name, copy / name)
    for name in ("workflow", "profiles"):
        shutil.copytree(REPO / name, copy / name, dirs_exist_ok=True)
    for path in (REPO / "config").glob("*.yaml"):
        if not (copy / "config" / path.name).exists():
            shutil.copy(path, copy / "config" / path.name)
    shutil.copy(REPO / "config" / "kubernetes.example.yaml", copy / "config" / "kubernetes.yaml")
    return copy


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory, tiny_campaign) -> Runner:
    root = tmp_path_factory.mktemp("checkouts")
    return Runner(
        clean=scratch_copy(root / "clean"),
        real=scratch_copy(root / "real"),
        campaign=campaign_copy(tiny_campaign, root / "campaign"),
    )


@pytest.fixture(scope="module")
def outcomes(runner: Runner) -> dict[DocCommand, list[Outcome]]:
    return runner.run_all(COMMANDS)


# ---------------------------------------------------------------------------------------- tests
def test_the_docs_show_commands_of_every_kind():
    programs = {_normalized(c.argv)[0] for c in COMMANDS}
    assert {"snakemake", "servelab", "make"} <= programs, programs


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where} {c.text[:50]}")
def test_documented_command_runs(command: DocCommand, outcomes: dict[DocCommand, list[Outcome]]):
    failed = [o.detail for o in outcomes[command] if not o.ok]
    assert not failed, f"{command.where}: `{command.text}`\n" + "\n".join(failed)


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_block_is_valid_shell(block: ShellBlock):
    result = subprocess.run(
        ["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, f"{block.where}: {result.stderr}"


def test_the_report_is_built_for_real_from_the_tiny_campaign(
    runner: Runner, outcomes: dict[DocCommand, list[Outcome]]
):
    ran = [
        o
        for os_ in outcomes.values()
        for o in os_
        if o.plan.argv[1:] == ("--report", "report.html")
    ]
    assert ran and all(o.ok for o in ran)
    report = runner.campaign / "report.html"
    assert report.stat().st_size > 10_000
    assert "table5" in report.read_text(errors="replace")


def test_every_ablation_has_a_documented_dry_run():
    """`snakemake -n` of each ablation of config/ablations/ (its record, the last thing it writes)
    and of the target `ablations` is shown, so each is run by test_documented_command_runs."""
    from servelab.campaign.ablations import load_ablations

    dry_runs = [
        c.argv for c in COMMANDS if _normalized(c.argv)[0] == "snakemake" and "-n" in c.argv
    ]
    shown = {word for argv in dry_runs for word in argv}
    ablations = load_ablations(REPO)
    assert ablations, "config/ablations/ holds no ablation: the loader is broken"
    missing = [a.id for a in ablations if f"{a.results_dir}/ablation.json" not in shown]
    assert not missing, f"docs/ablations.md shows no `snakemake -n` of {missing}"
    assert "ablations" in shown


def test_each_command_not_run_has_a_reason_and_is_still_documented():
    used = {prefix: 0 for prefix in NOT_RUN}
    for command in COMMANDS:
        line = " ".join(_normalized(command.argv)) + " "
        for prefix in NOT_RUN:
            used[prefix] += line.startswith(prefix + " ")
    assert all(NOT_RUN.values())
    assert [p for p, n in used.items() if n == 0] == [], "stale NOT_RUN entries"
    assert [c for c in COMMANDS for p in plan(c) if p.kind == "no rule"] == []


PLANTED_DOC = r"""# A planted page

```sh
make table5   # fine: make -n
make no-such-target
snakemake --cores 1 \
    results/table5.csv
snakemake --cores 1 results/no-such-output.csv
```

Run `snakemake --cores 1 --configfile config/test.yaml results/table5.csv` for a small grid, or
`make
table5`.

```
$ servelab trace show --no-such-option results/traces/rate-0.28/rep1
some output, not a command
servelab sim deploy|run --engine vllm|sglang --config FILE
servelab dispatch --no-such-flag X
```

```console
$ servelab resolve-config LOGFILE
{"engine": "vllm"}
```

```python
make = "not a command"
```

```text
tools/lock-verify-env.sh --check
tools/lock-verify-env.sh --no-such-option
tar -tzf path/to/bundle.tar.gz | less
vllm 0.12.0: a message that names a program, not a command
```

Also `UPDATE_GOLDENS=1 pytest tests/unit --no-such-flag`, `benchmarks/table5_wall.py --keep DIR`,
`curl http://127.0.0.1:8000/health` and `frobnicate --all` (no known program: prose).
And `python benchmarks/table5_wall.py --no-such-option`.
"""


def test_extractor_finds_the_commands_of_a_planted_page():
    commands, blocks = extract_markdown(PLANTED_DOC, "planted.md")
    assert [(c.where, c.argv) for c in commands] == [
        ("planted.md:4", ("make", "table5")),
        ("planted.md:5", ("make", "no-such-target")),
        ("planted.md:6", ("snakemake", "--cores", "1", "results/table5.csv")),
        ("planted.md:8", ("snakemake", "--cores", "1", "results/no-such-output.csv")),
        (
            "planted.md:11",
            ("snakemake", "--cores", "1", "--configfile", "config/test.yaml", "results/table5.csv"),
        ),
        ("planted.md:12", ("make", "table5")),  # an inline span may wrap a line
        (
            "planted.md:16",
            ("servelab", "trace", "show", "--no-such-option", "results/traces/rate-0.28/rep1"),
        ),
        (
            "planted.md:18",
            ("servelab", "sim", "deploy|run", "--engine", "vllm|sglang", "--config", "FILE"),
        ),
        ("planted.md:19", ("servelab", "dispatch", "--no-such-flag", "X")),
        ("planted.md:23", ("servelab", "resolve-config", "LOGFILE")),
        ("planted.md:32", ("tools/lock-verify-env.sh", "--check")),
        ("planted.md:33", ("tools/lock-verify-env.sh", "--no-such-option")),
        ("planted.md:34", ("tar", "-tzf", "path/to/bundle.tar.gz")),  # a pipe: two commands
        ("planted.md:34", ("less",)),
        ("planted.md:38", ("UPDATE_GOLDENS=1", "pytest", "tests/unit", "--no-such-flag")),
        ("planted.md:38", ("benchmarks/table5_wall.py", "--keep", "DIR")),
        ("planted.md:39", ("curl", "http://127.0.0.1:8000/health")),
        ("planted.md:40", ("python", "benchmarks/table5_wall.py", "--no-such-option")),
    ]
    assert [b.where for b in blocks] == ["planted.md:4"]
    assert [p.argv[1:] for p in plan(commands[7])] == [
        ("sim", "deploy", "--help"),
        ("sim", "run", "--help"),
    ]


def test_a_planted_bad_command_fails_and_a_good_one_passes(runner: Runner):
    commands, _ = extract_markdown(PLANTED_DOC, "planted.md")
    results = Runner(runner.clean, runner.real, runner.campaign).run_all(commands)
    ok = {c.argv: all(o.ok for o in results[c]) for c in commands}
    assert ok == {
        ("make", "table5"): True,
        ("make", "no-such-target"): False,
        ("snakemake", "--cores", "1", "results/table5.csv"): True,
        # a bad target in the batch fails its own command only
        ("snakemake", "--cores", "1", "results/no-such-output.csv"): False,
        # --configfile takes several files and swallows the target: the bug this test guards
        (
            "snakemake",
            "--cores",
            "1",
            "--configfile",
            "config/test.yaml",
            "results/table5.csv",
        ): False,
        ("servelab", "trace", "show", "--no-such-option", "results/traces/rate-0.28/rep1"): False,
        ("servelab", "sim", "deploy|run", "--engine", "vllm|sglang", "--config", "FILE"): True,
        # run as `servelab dispatch --help`, which does not list the option
        ("servelab", "dispatch", "--no-such-flag", "X"): False,
        ("servelab", "resolve-config", "LOGFILE"): True,
        ("tools/lock-verify-env.sh", "--check"): True,  # valid shell that knows the option
        ("tools/lock-verify-env.sh", "--no-such-option"): False,
        ("tar", "-tzf", "path/to/bundle.tar.gz"): True,  # for real, on the tiny campaign's bundle
        ("less",): True,  # not run, with its reason
        ("UPDATE_GOLDENS=1", "pytest", "tests/unit", "--no-such-flag"): False,
        ("benchmarks/table5_wall.py", "--keep", "DIR"): True,
        ("curl", "http://127.0.0.1:8000/health"): False,  # a known program no rule runs
        # a script's --help, run in a fork (tests/forked_runs.py), that does not list the option
        ("python", "benchmarks/table5_wall.py", "--no-such-option"): False,
    }
