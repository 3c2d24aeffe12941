"""The `scaling` command follows the conventions of a command-line tool: --version; every
command's --help with a description, examples and its exit statuses; help text on every option
with its default; closed choices as choices; --out a directory everywhere; a missing argument
named as missing (exit 2, one line); tables whose rows are never folded when the output is not
a terminal (a log, a pipe, CI). In process (`scaling.cli.main`), so in the unit tier.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from scaling.cli import _build_parser, main
from tests.fake_sweep import make_fake_sweep


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(words, parser) for `scaling` and every command and subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(_build_parser()))
IDS = [" ".join(words) or "scaling" for words, _ in COMMANDS]


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.strip() == f"scaling {version('scaling-lab')}"


def test_every_command_is_covered():
    assert {
        "run",
        "sweep",
        "report",
        "project",
        "cluster check",
        "minicluster up",
        "minicluster exec",
        "minicluster preempt",
        "minicluster rejoin",
        "minicluster status",
        "minicluster down",
        "dashboard install",
    } <= set(IDS)


@pytest.mark.parametrize("words, parser", COMMANDS, ids=IDS)
def test_help_has_a_description_examples_and_exit_statuses(words, parser, capsys):
    with pytest.raises(SystemExit) as ended:
        main([*words, "--help"])
    assert ended.value.code == 0
    text = capsys.readouterr().out
    assert parser.description and parser.description.split()[0] in text
    examples = text.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert examples and all(line.strip().startswith("scaling ") for line in examples)
    statuses = text.split("exit status:\n", 1)[1]
    assert re.search(r"^\s+2\s", statuses, re.M), "exit status 2 (bad input) is listed"


@pytest.mark.parametrize("words, parser", COMMANDS, ids=IDS)
def test_every_option_has_help_with_its_default(words, parser):
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help is not argparse.SUPPRESS, f"{' '.join(words)} {name}: no help text"
        takes_a_value = action.option_strings and action.nargs != 0
        if takes_a_value:
            assert "default" in action.help or action.required, f"{' '.join(words)} {name}: its default is not said"
        if action.required and action.option_strings:
            assert "(required)" in action.help or words == ("project",), f"{' '.join(words)} {name}: say it is required"


@pytest.mark.parametrize(
    "option, expected",
    [
        (("run", "--launcher"), {"ray", "local"}),
        (("sweep", "--launcher"), {"ray", "local"}),
        (("project", "--precision"), {"fp32", "fp16", "bf16", "amp"}),
        (("project", "--grad-compression"), {"none", "fp16", "bf16"}),
        (("project", "--backend"), {"ddp", "horovod"}),
        (("project", "--allreduce"), {"ring", "hierarchical"}),
        (("project", "--model"), {"resnet50", "small_cnn"}),
    ],
)
def test_closed_choices_are_choices(option, expected):
    *words, flag = option
    parser = dict(zip(IDS, (p for _, p in COMMANDS)))[" ".join(words)]
    action = next(a for a in parser._actions if flag in a.option_strings)
    assert expected <= set(action.choices or ())


def test_choice_lists_are_read_from_where_each_choice_is_defined():
    from scaling.launch import LAUNCHERS
    from scaling.projection import from_run, layers, spec

    defined = {
        ("run", "--launcher"): tuple(LAUNCHERS),
        ("sweep", "--launcher"): tuple(LAUNCHERS),
        ("project", "--reshard-after-forward"): spec.RESHARD,
        ("project", "--activation-checkpointing"): spec.ACTIVATION_CHECKPOINTING,
        ("project", "--backend"): spec.BACKENDS,
        ("project", "--grad-compression"): tuple(layers.COMPRESSION_BYTES),
        ("project", "--fsdp-param-dtype"): layers.FSDP_DTYPES,
        ("project", "--fsdp-reduce-dtype"): layers.FSDP_DTYPES,
    }
    parsers = dict(zip(IDS, (p for _, p in COMMANDS)))
    for (command, flag), choices in defined.items():
        action = next(a for a in parsers[command]._actions if flag in a.option_strings)
        assert tuple(action.choices) == tuple(choices), (command, flag)
    gpus = next(a for a in parsers["project"]._actions if "--gpus" in a.option_strings)
    assert from_run.DEFAULT_GPUS in gpus.help


def test_run_and_sweep_share_their_options():
    parsers = dict(zip(IDS, (p for _, p in COMMANDS)))
    shared = ("--workers", "--out", "--wait", "--set", "--launcher")
    for flag in shared:
        run, sweep = (next(a for a in parsers[c]._actions if flag in a.option_strings) for c in ("run", "sweep"))
        assert (run.dest, run.choices, run.default) == (sweep.dest, sweep.choices, sweep.default), flag


def test_out_is_a_directory_everywhere():
    for words, parser in COMMANDS:
        for action in parser._actions:
            if "--out" in action.option_strings:
                assert action.metavar == "DIR" and "director" in action.help, " ".join(words)


@pytest.mark.parametrize(
    "argv, named",
    [
        ([], "COMMAND"),
        (["run"], "CONFIG"),
        (["sweep"], "CONFIG"),
        (["report"], "SWEEP_DIR"),
        (["project"], "--cluster"),
        (["cluster"], "ACTION"),
        (["cluster", "check"], "YAML"),
        (["minicluster"], "ACTION"),
        (["minicluster", "up"], "--nodes"),
        (["minicluster", "preempt"], "--node"),
        (["minicluster", "exec"], "the command is missing"),
        (["minicluster", "exec", "--"], "the command is missing"),
        (["dashboard"], "ACTION"),
        (["attach"], "--out"),
        (["attach", "--out", "x"], "the command is missing"),
    ],
)
def test_a_missing_argument_is_named_as_missing(argv, named, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert named in err and ("required" in err or "missing" in err), err


def _folded_rows(text: str) -> list[str]:
    """Lines of rich tables that continue a row folded over several lines: a second header line,
    or a body line whose first cell is empty."""
    lines = text.splitlines()
    folded = []
    for before, line in zip(["", *lines], lines):
        if line.startswith("┃") and before.startswith("┃"):
            folded.append(line)
        if line.startswith("│") and not line[1:].split("│", 1)[0].strip():
            folded.append(line)
    return folded


def test_report_rows_are_not_folded_off_a_terminal(tmp_path, capsys):
    sweep = make_fake_sweep(tmp_path)
    assert main(["report", str(sweep), "--no-figures"]) == 0
    out = capsys.readouterr().out  # captured: not a terminal, as a log, a pipe or CI
    assert out.count("┏") >= 5, "the report's tables are printed"
    assert not _folded_rows(out), "\n".join(_folded_rows(out)[:5])
    assert any("reached_target" in line and line.startswith("│") for line in out.splitlines())


def test_projection_rows_are_not_folded_off_a_terminal(capsys):
    assert main(["project", "--cluster", "p3.16xlarge", "--nodes", "1,2", "--epochs-to-target", "256:30"]) == 0
    out = capsys.readouterr().out
    assert out.count("┏") == 1 and not _folded_rows(out)


@pytest.mark.slow  # a process of its own
@pytest.mark.parametrize("printer", ["plain", "rich"])
def test_a_reader_that_closes_the_pipe_early_gets_no_traceback(tmp_path, printer):
    # `scaling why SWEEP | head`: the reader is gone before anything is printed; `why` prints plain lines,
    # `project` a rich table
    if printer == "plain":
        command = ["why", str(make_fake_sweep(tmp_path / "sweep"))]
    else:
        command = ["project", "--model", "resnet50", "--cluster", "p3.16xlarge"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "scaling.cli", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err == b"", err.decode()
