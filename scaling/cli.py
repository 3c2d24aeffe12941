"""The `scaling` command.

    scaling run CONFIG [--workers N] [--out DIR] [--set key=value ...] [--launcher ray|local]
    scaling sweep CONFIG [--workers 1,2,4] [--repeats R] [--out DIR] [--launcher ray|local]
    scaling report SWEEP_DIR [SWEEP_DIR ...] [--out DIR]
    scaling why RUN_DIR | SWEEP_DIR [--json]
    scaling compare A B [--json]
    scaling project --model resnet50 --cluster p3.16xlarge --nodes 1,2,4,8,16 [--json] [--out DIR] [--from-run DIR ...]
    scaling cluster check cluster/aws-p3.16xlarge.yaml
    scaling minicluster up --nodes N [--bandwidth 1gbit] | status | exec -- CMD | preempt|rejoin --node I | down
    scaling dashboard install [--session-dir DIR]
    scaling attach --out RUN_DIR -- CMD ...   (an unchanged HF Trainer / Lightning job, measured)
    scaling --version

Bad input (config, arguments, a cluster too small for the request, an unwritable output
directory) ends with exit status 2 and one line on stderr, before anything is written; a
failed run (or a failed run of a sweep) with 1; Ctrl-C with 130. Every command's --help has a
description, examples and its exit statuses; `--out` is always a directory. Tables keep the
terminal's width on a terminal, and are never folded when the output is a log, a pipe or CI.

Each command's parsing and dispatch is here; what it runs lives below (scaling.launch, scaling.report,
scaling.projection, scaling.testbed), what it prints in scaling.console, and none of them imports this
module. The options `run` and `sweep` share are defined once (`_job_options`); every choice list is read
from the module that defines the choice.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from scaling import console, extras
from scaling.errors import UsageError
from scaling.writer_lock import WriterLock

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 1  # as rich's console exits when its reader closed the pipe (Console.on_broken_pipe)
# commands whose output is only what they print: a reader that closes the pipe early (`scaling why RUN | head`)
# has read what it wanted
PRINTING_COMMANDS = ("why", "compare", "project")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (the usage stays available under --help): the lab's
    parser for every command line, `scaling` and its subcommands (and scripts/gpu_first_contact.py)."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version(extras.DISTRIBUTION)
    except PackageNotFoundError:  # run from a checkout that was never installed
        from scaling import __version__

        return __version__


# Exit statuses, as each command's --help lists them.
_USAGE = "  2    bad input (config, arguments, paths): one line on stderr, nothing written"
_INTERRUPTED = "  130  interrupted (Ctrl-C)"


def _epilog(examples: list[str], statuses: list[str]) -> str:
    return "\n".join(["examples:", *(f"  {e}" for e in examples), "", "exit status:", *statuses])


def _command(commands, name: str, help: str, description: str, examples: list[str], statuses: list[str]):
    """A subcommand whose --help has a description, examples and its exit statuses."""
    return commands.add_parser(
        name,
        help=help,
        description=description,
        epilog=_epilog(examples, statuses),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _job_options(parser: argparse.ArgumentParser, workers: dict, out: str, wait: str, overrides: str) -> None:
    """The options `scaling run` and `scaling sweep` share, defined once: what differs between them is their
    help (a run's directory or a sweep's) and --workers, one count for a run, a list for a sweep."""
    from scaling.launch import LAUNCHERS

    parser.add_argument("--workers", **workers)
    parser.add_argument("--out", type=Path, metavar="DIR", help=out)
    parser.add_argument("--wait", action="store_true", help=wait)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=overrides)
    parser.add_argument(
        "--launcher",
        choices=tuple(LAUNCHERS),
        default="ray",
        help="; ".join(f"{name}: {what}" for name, what in LAUNCHERS.items()) + " (default: ray)",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="scaling",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A distributed training-scaling lab on Ray: time every step of a data-parallel run, roll runs\n"
        "up into speedup, time to accuracy and communication overhead, and project them onto a cluster.",
        epilog=_epilog(
            [
                "scaling run experiments/quickstart.yaml --workers 2 --launcher local",
                "scaling sweep experiments/quickstart.yaml --out results/demo",
                "scaling report results/demo",
                "scaling project --cluster p3.16xlarge --nodes 1,2,4,8 --out results/projection",
                "scaling cluster check cluster/aws-p3.16xlarge.yaml",
                "scaling minicluster up --nodes 2          (root)",
            ],
            [
                "  0    done",
                "  1    a run failed (run), or a run of the sweep failed (sweep)",
                _USAGE,
                _INTERRUPTED,
            ],
        )
        + "\n\nEach command's options: scaling COMMAND --help.",
    )
    parser.add_argument(
        "--version", action="version", version=f"scaling {version()}", help="print the lab's version and exit"
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser, metavar="COMMAND")
    _run_command(commands)
    _sweep_command(commands)
    _report_command(commands)
    _compare_command(commands)
    _why_command(commands)
    _project_command(commands)
    _cluster_command(commands)
    _minicluster_command(commands)
    _dashboard_command(commands)
    _attach_command(commands)
    return parser


def _run_command(commands) -> None:
    run = _command(
        commands,
        "run",
        "one data-parallel training run, timed step by step",
        "Train the config's model with N data-parallel workers, timing every step (data, forward,\n"
        "backward, optimizer, all-reduce), and write the run directory: its records, summary.json\n"
        "and a one-screen summary.",
        [
            "scaling run experiments/quickstart.yaml",
            "scaling run experiments/quickstart.yaml --workers 2 --launcher local --out results/qs-w2",
            "scaling run experiments/quickstart.yaml --set optim.lr=0.2 --set train.max_epochs=3",
        ],
        [
            "  0    the run finished (its target reached or its epochs run)",
            "  1    the run failed",
            _USAGE,
            _INTERRUPTED,
        ],
    )
    run.add_argument("config", metavar="CONFIG", help="experiment YAML, e.g. experiments/quickstart.yaml")
    _job_options(
        run,
        workers=dict(
            type=int, metavar="N", help="number of data-parallel workers (default: the config's workers.num_workers)"
        ),
        out="run directory (default: results/<name>-w<N>-<time>)",
        wait="another process writing --out: wait for it to finish, then run if it left no finished run "
        "(default: refuse, exit 2)",
        overrides="override a config field, e.g. --set optim.lr=0.2; repeatable (default: none)",
    )


def _sweep_command(commands) -> None:
    sweep = _command(
        commands,
        "sweep",
        "every worker count x repeat (x sweep axes) as its own run; resumable",
        "Run every point of a sweep (worker counts x repeats, x the config's sweep axes), each as its\n"
        "own run under one sweep directory, with runs.parquet indexing them. Re-running the same\n"
        "command resumes: finished runs are kept, failed and unfinished ones run again.",
        [
            "scaling sweep experiments/quickstart.yaml --out results/demo",
            "scaling sweep experiments/quickstart.yaml --workers 1,2 --repeats 3 --launcher local",
            "scaling sweep experiments/quickstart.yaml --repeats auto --interval-width 0.05 --max-repeats 6",
        ],
        [
            "  0    every run finished",
            "  1    at least one run failed (re-run the command to redo it)",
            _USAGE,
            _INTERRUPTED,
        ],
    )
    sweep.add_argument("config", metavar="CONFIG", help="experiment YAML, optionally with a sweep: section")
    sweep.add_argument(
        "--repeats",
        metavar="R|auto",
        help="seeds per point, or auto: add repeats until each point's 95%% interval is "
        "within --interval-width (default: the config's sweep.repeats)",
    )
    sweep.add_argument(
        "--interval-width",
        type=float,
        default=0.05,
        help="--repeats auto: the relative half-width to reach (default: 0.05, i.e. ±5%%)",
    )
    sweep.add_argument(
        "--max-repeats", type=int, default=6, help="--repeats auto: at most this many repeats per point (default: 6)"
    )
    _job_options(
        sweep,
        workers=dict(
            metavar="N,N,...", help="comma-separated worker counts, e.g. 1,2 (default: the config's sweep.workers)"
        ),
        out="sweep directory (default: results/<name>-sweep)",
        wait="another process writing --out: wait for it to finish, then resume what it left (default: refuse, exit 2)",
        overrides="override a base config field for every run; repeatable (default: none)",
    )


def _report_command(commands) -> None:
    report = _command(
        commands,
        "report",
        "tables and figures of a sweep directory (or of several, merged)",
        "Print a sweep's tables (scaling, uncertainty, time to accuracy, communication, utilisation,\n"
        "runs) and write its report directory: report.md and the figures, each as PNG and SVG.",
        [
            "scaling report results/demo",
            "scaling report results/ddp-sweep results/horovod-sweep --out results/ddp-vs-horovod",
        ],
        ["  0    report written", _USAGE],
    )
    report.add_argument(
        "sweep_dirs",
        type=Path,
        nargs="+",
        metavar="SWEEP_DIR",
        help="a sweep directory; several are merged into one report (needs --out)",
    )
    report.add_argument(
        "--out", type=Path, metavar="DIR", help="report directory (default: SWEEP_DIR/report; required for several)"
    )
    report.add_argument(
        "--no-figures",
        action="store_true",
        help="the tables only: report.md without the figures, whose drawing is most of a report's time",
    )


def _compare_command(commands) -> None:
    compare_ = _command(
        commands,
        "compare",
        "two runs or two sweeps, figure by figure: what moved beyond the noise",
        "Compare B against A (two run directories, or two sweep directories, e.g. before and after a\n"
        "change): step time, throughput, time per epoch, the communication figures, TTA and MFU, each\n"
        "change with its 95% interval and a verdict: better, worse, within noise, or no interval.",
        [
            "scaling compare results/before/w2 results/after/w2",
            "scaling compare results/demo results/demo-bf16 --json",
        ],
        [
            "  0    no figure got worse beyond the noise",
            "  1    a figure got worse beyond the noise (a CI job can gate on it)",
            _USAGE,
        ],
    )
    compare_.add_argument("a", type=Path, metavar="A", help="the baseline: a run or sweep directory")
    compare_.add_argument("b", type=Path, metavar="B", help="the run or sweep compared with it")
    compare_.add_argument(
        "--json", action="store_true", help="the table as JSON, one object per figure (default: a table)"
    )


def _why_command(commands) -> None:
    why_ = _command(
        commands,
        "why",
        "why a run or sweep scales as it does: the causes ranked, each with its fix and its price",
        "Rank the causes that cost a run (or a sweep's largest run, and the sweep across worker counts)\n"
        "its step: each with the figure it rests on (a share of the step, 95% interval), a fix and the\n"
        "gain the fix would bring (the run's own projection re-run with the fix, or the share removed).\n"
        "Causes the data rules out are not listed; undecided ones name the run that would decide them.",
        ["scaling why results/demo", "scaling why results/demo/runs/w2-r0 --json"],
        ["  0    explained", _USAGE],
    )
    why_.add_argument("path", type=Path, metavar="RUN_OR_SWEEP_DIR", help="a run directory or a sweep directory")
    why_.add_argument("--json", action="store_true", help="the verdict as one JSON object (default: one screen)")


def _project_command(commands) -> None:
    project = _command(
        commands,
        "project",
        "project step time, speedup and comm overhead onto a cluster (alpha-beta model)",
        "Project data-parallel scaling (DDP or Horovod step time, speedup, the three communication\n"
        "figures, time per epoch and, given epochs to target, time to accuracy) onto a cluster with\n"
        "the alpha-beta model, from a device table or from this machine's measured runs. Given a run\n"
        "directory of your own job (attach, the lab's loop), it projects that job: step, throughput,\n"
        "the three figures and memory per GPU, each with an interval from the run's own steps.",
        [
            "scaling project results/my-job --cluster p5.48xlarge --gpus 8,32,128",
            "scaling project results/my-job --cluster h200x8_400g_per_gpu --gpus 8,128 --compute-ms 42",
            "scaling project --cluster p3.16xlarge --nodes 1,2,4,8,16",
            "scaling project --model resnet50 --cluster p3.16xlarge --precision amp --out results/projection",
            "scaling project --cluster p3.16xlarge --from-run results/qs-w1 --json",
        ],
        ["  0    projected", _USAGE],
    )
    _project_arguments(project)


def _cluster_command(commands) -> None:
    cluster = _command(
        commands,
        "cluster",
        "cluster YAMLs for ray up",
        "Cluster YAMLs for `ray up`, checked offline before a cluster is paid for.",
        ["scaling cluster check cluster/aws-p3.16xlarge.yaml"],
        ["  0    every YAML is valid", _USAGE],
    )
    cluster_commands = cluster.add_subparsers(
        dest="action", required=True, parser_class=OneLineParser, metavar="ACTION"
    )
    check = _command(
        cluster_commands,
        "check",
        "validate cluster YAMLs offline (Ray's validator + the lab's checks)",
        "Validate cluster YAMLs offline: Ray's own checks (those `ray up` runs first), then the lab's\n"
        "(resources against the instance table, shared storage, open ports, a pinned image, node\n"
        "counts, a spot worker type, torch's GPU kernels). Prints `<path>: ok` for each valid one.",
        ["scaling cluster check cluster/aws-p3.16xlarge.yaml", "scaling cluster check cluster/*.yaml"],
        ["  0    every YAML is valid", "  2    a YAML is refused (one line naming each problem) or bad arguments"],
    )
    check.add_argument("paths", nargs="+", type=Path, metavar="YAML", help="cluster YAML files to check")


def _minicluster_command(commands) -> None:
    mini = _command(
        commands,
        "minicluster",
        "a multi-node Ray cluster on this machine (network namespaces; root)",
        "A multi-node Ray cluster on this machine: one network namespace per node, joined by a\n"
        "bridge, each link optionally capped; needs root.",
        [
            "scaling minicluster up --nodes 2 --bandwidth 1gbit",
            "scaling minicluster exec -- scaling sweep experiments/quickstart.yaml --workers 2",
            "scaling minicluster down",
        ],
        [
            "  0    done",
            "  1    a step failed (the message names it)",
            "  2    bad arguments, not root, or no such minicluster (one line on stderr)",
            "  N    exec: the command's own",
        ],
    )
    mini_commands = mini.add_subparsers(dest="action", required=True, parser_class=OneLineParser, metavar="ACTION")
    name_help = "which minicluster (default: lab)"
    mini_statuses = [
        "  0    done",
        "  1    a step failed (the message names it)",
        "  2    bad arguments, not root, or no such minicluster (one line on stderr)",
    ]
    mini_up = _command(
        mini_commands,
        "up",
        "build N namespaced nodes joined by a bridge, each a Ray node",
        "Build N nodes (network namespaces on a private subnet, joined by a bridge), node 0 a Ray\n"
        "head and the others Ray workers; on any failure, or SIGTERM or Ctrl-C, remove what was made.",
        ["scaling minicluster up --nodes 2", "scaling minicluster up --nodes 4 --bandwidth 1gbit --cpus-per-node 2"],
        mini_statuses[:2]
        + [
            mini_statuses[2].replace("or no such minicluster", "or a minicluster of that name is up"),
            "  130  interrupted (Ctrl-C): what was made is removed",
            "  143  ended by SIGTERM: what was made is removed",
        ],
    )
    mini_up.add_argument(
        "--nodes", type=int, required=True, help="number of nodes, 1 to 50; node 0 is the head (required)"
    )
    mini_up.add_argument(
        "--bandwidth", help="cap each node's link, a tc rate such as 100mbit or 1gbit (default: uncapped)"
    )
    mini_up.add_argument("--cpus-per-node", type=int, default=1, help="CPUs each node's Ray offers (default: 1)")
    mini_up.add_argument(
        "--pin-cpus",
        action="store_true",
        help="hold each node's processes to its own --cpus-per-node CPUs of this machine, as separate machines are",
    )
    mini_up.add_argument(
        "--head-cpus",
        type=int,
        default=None,
        help="CPUs the head's Ray offers (default: --cpus-per-node); 0: a head that runs no workers",
    )
    mini_up.add_argument(
        "--subnet", default="10.213.0.0/24", help="private subnet of the nodes (default: 10.213.0.0/24)"
    )
    mini_up.add_argument("--name", default="lab", help=name_help)
    for action, text, description, example in (
        (
            "status",
            "nodes, IPs, caps, liveness",
            "Print the minicluster's nodes as JSON: namespaces, IPs, link caps, whether each Ray node is alive.",
            "scaling minicluster status",
        ),
        (
            "down",
            "remove exactly what up made",
            "Remove exactly what `up` recorded: the processes in its namespaces, the namespaces, the bridge.",
            "scaling minicluster down --name lab",
        ),
    ):
        sub = _command(mini_commands, action, text, description, [example], mini_statuses)
        sub.add_argument("--name", default="lab", help=name_help)
    for action, text, description in (
        (
            "preempt",
            "take a worker node away as a spot preemption does (link down, processes killed)",
            "Take a worker node away as a spot preemption does: its link down, every process in it killed.",
        ),
        (
            "rejoin",
            "bring a preempted node back (link up, Ray started)",
            "Bring a preempted node back, as an autoscaler's replacement: link up, Ray started, every node alive.",
        ),
    ):
        sub = _command(
            mini_commands, action, text, description, [f"scaling minicluster {action} --node 1"], mini_statuses
        )
        sub.add_argument("--name", default="lab", help=name_help)
        sub.add_argument(
            "--node", type=int, required=True, help="which worker node, 1..N-1 (node 0 is the head) (required)"
        )
    mini_exec = _command(
        mini_commands,
        "exec",
        "run a command inside the cluster (head namespace, RAY_ADDRESS set)",
        "Run a command inside the cluster, as its driver: in a node's namespace (the head's by\n"
        "default) with RAY_ADDRESS set. Everything after -- is the command.",
        [
            "scaling minicluster exec -- scaling sweep experiments/quickstart.yaml --workers 2",
            "scaling minicluster exec --node 1 -- ip addr",
        ],
        ["  N    the command's own exit status", "  2    no command, bad arguments, not root, or no such minicluster"],
    )
    mini_exec.add_argument("--name", default="lab", help=name_help)
    mini_exec.add_argument("--node", type=int, default=0, help="which node's namespace (default: 0, the head)")
    mini_exec.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the command and its arguments, after -- (required)",
    )


def _dashboard_command(commands) -> None:
    dashboard = _command(
        commands,
        "dashboard",
        "the lab's Grafana dashboard, beside Ray's Train Dashboard",
        "The lab's Grafana dashboard (step time per rank, communication, stragglers, throughput, MFU),\n"
        "shipped with the package and shown beside Ray's Train Dashboard (docs/dashboard.md).",
        ["scaling dashboard install"],
        ["  0    done", _USAGE],
    )
    dashboard_commands = dashboard.add_subparsers(
        dest="action", required=True, parser_class=OneLineParser, metavar="ACTION"
    )
    dashboard_install = _command(
        dashboard_commands,
        "install",
        "copy the dashboard where Ray's Grafana provisioning finds it",
        "Copy the dashboard into the Grafana provisioning a Ray head wrote under its session directory\n"
        "(<session>/metrics/grafana/dashboards/, beside Ray's own dashboards) and print how to open it.\n"
        "Without a session on this machine (and no --session-dir), print the dashboard's path and how to\n"
        "import it by hand. A head started again rewrites that folder: install again after `ray start`.",
        ["scaling dashboard install", "scaling dashboard install --session-dir /tmp/ray/session_latest"],
        [
            "  0    installed (or, with no Ray session here, the dashboard's path and the steps printed)",
            "  2    the session directory is not a Ray head's with its Grafana folder, or bad arguments "
            "(one line on stderr, nothing written)",
        ],
    )
    dashboard_install.add_argument(
        "--session-dir",
        type=Path,
        metavar="DIR",
        help="the Ray head's session directory, e.g. /tmp/ray/session_latest (default: $RAY_TMPDIR or the system's "
        "temp dir, then ray/session_latest)",
    )


def _attach_command(commands) -> None:
    attach = _command(
        commands,
        "attach",
        "measure an unchanged Hugging Face Trainer or Lightning job",
        "Run CMD (a script, torchrun, accelerate launch ...) with the instrument attached to every\n"
        "transformers.Trainer and lightning.Trainer its processes build: each gets the trainer's\n"
        "ScalingCallback (docs/trainers.md) writing into --out, without a line of the job changed.\n"
        "The job's exit status is attach's.",
        [
            "scaling attach --out results/my-job/w2 -- torchrun --nproc_per_node 2 train.py",
            "scaling attach --out results/my-job/w1 --target-loss 3.28 -- python train.py --epochs 3",
        ],
        [
            "  0    the job ran and was measured",
            "  1    the job built no Trainer (nothing measured), or it failed with status 1",
            "  N    the job's own exit status",
            _USAGE,
        ],
    )
    attach.add_argument("--out", type=Path, required=True, metavar="DIR", help="the run directory written (required)")
    attach.add_argument(
        "--wait",
        action="store_true",
        help="another process writing --out: wait for it to finish, then run if it left no finished run "
        "(default: refuse, exit 2)",
    )
    attach.add_argument(
        "--target-loss", type=float, metavar="LOSS", help="the evaluation loss TTA is measured to (default: no TTA)"
    )
    attach.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the job's command line")


def _cmd_attach(args) -> int:
    import shutil

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError("scaling attach: the command is missing: give it after --, e.g. -- torchrun train.py")
    if shutil.which(command[0]) is None:
        raise UsageError(f"scaling attach: {command[0]}: command not found")
    _check_out_dir(args.out)
    run_dir = args.out.resolve()
    with WriterLock(run_dir, "scaling attach", wait=args.wait):
        return _attach_job(command, run_dir, args)


def _attach_job(command: list[str], run_dir: Path, args) -> int:
    import signal
    import subprocess

    from scaling.integrations import auto
    from scaling.results import SUMMARY_JSON

    if (run_dir / SUMMARY_JSON).exists():
        raise UsageError(f"{args.out} holds a finished run ({SUMMARY_JSON}): give a new run directory")
    job = subprocess.Popen(command, env=auto.environment(str(run_dir), args.target_loss))
    # a scheduler's SIGTERM to this process reaches the job (Ctrl-C reaches the whole process group)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: job.send_signal(signum))
    try:
        status = job.wait()
    except KeyboardInterrupt:
        status = job.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if (run_dir / SUMMARY_JSON).exists():
        print(f"records and summary in {args.out}")
        return status
    if status == 0:
        print(
            f"error: the job built no transformers.Trainer or lightning.Trainer that finished training: "
            f"nothing measured in {args.out}",
            file=sys.stderr,
        )
        return 1
    return status


def _cmd_cluster(args) -> int:
    from scaling.cluster_check import check_cluster_yaml

    refused = []
    for path in args.paths:
        problems = check_cluster_yaml(path)
        if problems:
            refused.append(f"{path}: {'; '.join(problems)}")
        else:
            print(f"{path}: ok")
    if refused:
        raise UsageError(" | ".join(refused))
    return 0


# ---------------------------------------------------------------------------- scaling project
# The projection (scaling/projection/) is pure Python; its command line, table and figure are wired here.


def _flag_dest(name: str, flag) -> str:
    """Where argparse keeps a spec field's flag: the flag's own name (--straggler-ms: straggler_ms)."""
    return flag.option(name).lstrip("-").replace("-", "_")


def _spec_default(name: str):
    from scaling.projection.spec import ProjectionSpec

    return next(f.default for f in dataclasses.fields(ProjectionSpec) if f.name == name)


def _spec_values(args) -> dict:
    """The spec's fields the command line set (None: not given), in the fields' units."""
    from scaling.projection.spec import flag_fields

    values = {}
    for name, flag in flag_fields():
        value = getattr(args, _flag_dest(name, flag))
        if value is not None:
            values[name] = flag.to_field(value) if flag.to_field else value
    return values


def _project_arguments(parser: argparse.ArgumentParser) -> None:
    from scaling.projection.from_run import DEFAULT_GPUS
    from scaling.projection.spec import flag_fields
    from scaling.projection.tta import LR_RULES

    parser.add_argument(
        "run_dir",
        nargs="?",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="a run directory of your own job (made by attach or scaling run): project that job "
        "(scaling/projection/from_run.py; default: none, --model's layer table)",
    )
    parser.add_argument(
        "--gpus", default=None, help=f"with RUN_DIR: comma-separated GPU counts, e.g. 8,32,128 (default {DEFAULT_GPUS})"
    )
    parser.add_argument(
        "--compute-ms",
        type=float,
        default=None,
        help="with RUN_DIR: one target GPU's forward + backward per step at the run's batch, in ms "
        "(default: the run's, measured on the target's GPU, else its FLOPs at --mfu)",
    )
    parser.add_argument(
        "--fsdp-units",
        type=int,
        default=None,
        help="with RUN_DIR and --backend fsdp: blocks to split the model into when the run has no "
        "FSDP2 per-module records (default: the run's collectives)",
    )
    # the projection's own options: one per field of ProjectionSpec that carries a flag (spec.py)
    for name, flag in flag_fields():
        options = {"default": _spec_default(name) if flag.set_default else None, "help": flag.help}
        for key in ("type", "metavar", "nargs"):
            if getattr(flag, key) is not None:
                options[key] = getattr(flag, key)
        if flag.choices is not None:
            options["choices"] = flag.choices()
        if flag.required:
            options["required"] = True
        parser.add_argument(flag.option(name), dest=_flag_dest(name, flag), **options)
    # the samples-to-target model's inputs: they make the spec's samples_to_target (a run directory: its own)
    parser.add_argument(
        "--noise-scale",
        default=None,
        metavar="B[:LOW:HIGH]",
        help="the job's gradient noise scale (a run's summary.json noise_scale, with its interval) for epochs to "
        "target beyond the --epochs-to-target batches by the samples-to-target model (docs/projection.md; "
        "default: none, the earlier rule beyond them)",
    )
    parser.add_argument(
        "--lr-rule",
        choices=LR_RULES,
        default=None,
        help="how the job's learning rate follows the global batch, for the samples-to-target model's support "
        "(default: the run's optim.lr_rule, else linear)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory for the figure and the rows: DIR/projection.png, .svg and .json "
        "(default: none, the table only)",
    )


def _check_out_dir(out: Path) -> None:
    """`--out` names a directory, for every command: refused in one line before anything runs."""
    if out.suffix.lower() in (".png", ".svg", ".json") and not out.is_dir():
        raise UsageError(
            f"--out is a directory (the projection goes to DIR/projection.png, .svg and .json), got the file name {out}"
        )
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")


def _epochs_from_sweep(args) -> None:
    """`--epochs-to-target SWEEP_DIR`: the sweep's measured epochs to target per global batch, in its place."""
    from scaling.results import SweepDir

    text = args.epochs_to_target
    if text is None or ":" in str(text):
        return
    try:
        table = SweepDir(text).epochs_to_target()
    except (OSError, ValueError, UsageError) as error:
        raise UsageError(
            f"--epochs-to-target {text}: neither GLOBAL_BATCH:EPOCHS pairs nor a sweep ({error})"
        ) from None
    if not table:
        raise UsageError(f"--epochs-to-target {text}: no run of the sweep reached its target at a known global batch")
    args.epochs_to_target = table


def _cmd_project(args) -> int:
    import json

    from scaling.projection.compute import run_model
    from scaling.projection.project import project
    from scaling.projection.spec import DEFAULT_NODES, ProjectionSpec
    from scaling.results import RunDir

    _epochs_from_sweep(args)

    if args.out is not None:
        _check_out_dir(args.out)
    if args.run_dir is not None:
        return _project_run_dir(args)
    for flag, value in (("--gpus", args.gpus), ("--compute-ms", args.compute_ms), ("--fsdp-units", args.fsdp_units)):
        if value is not None:
            raise UsageError(f"{flag} projects a run directory: give it, e.g. scaling project RUN_DIR --cluster ...")
    values = _spec_values(args)
    runs = [RunDir(path) for path in args.from_run] if args.from_run else None
    values["from_run"] = runs[0] if runs is not None and len(runs) == 1 else runs
    values["model"] = args.model or (run_model(runs[0]) if runs else None) or "resnet50"
    if args.nodes is None and args.workers is None:
        values["nodes"] = DEFAULT_NODES
    values["samples_to_target"] = _samples_to_target(args)
    df = project(ProjectionSpec(**values))
    rows = [{k: console.json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")]
    written = console.write_projection(df, rows, args.out) if args.out is not None else []
    if args.json:
        print(json.dumps(rows, indent=1))
        for line in df.attrs.get("notes", []):
            print(f"note: {line}", file=sys.stderr)
        for line in df.attrs.get("caveats", []):
            print(f"caveat: {line}", file=sys.stderr)
        for path in written:
            print(f"written: {path}", file=sys.stderr)
    else:
        console.print_projection(df)
        if written:
            print("written: " + ", ".join(str(p) for p in written))
    return 0


def _samples_to_target(args):
    """`--noise-scale B[:LOW:HIGH]` with `--epochs-to-target`: the samples-to-target model anchored at the table's
    smallest batch (scaling/projection/tta.py); None without a noise scale."""
    from scaling.projection import tta
    from scaling.projection.tta import parse_epochs_table

    if args.noise_scale is None:
        return None
    table = parse_epochs_table(args.epochs_to_target)
    if table is None:
        raise UsageError("--noise-scale needs --epochs-to-target: the epochs measured at one batch at least")
    try:
        values = [float(v) for v in str(args.noise_scale).split(":")]
        value, low, high = values if len(values) == 3 else (values[0], values[0], values[0])
        noise = tta.NoiseScale(value, low, high)
    except ValueError:
        raise UsageError(
            f"--noise-scale takes B or B:LOW:HIGH with 0 <= LOW <= B <= HIGH, got {args.noise_scale!r}"
        ) from None
    batch = min(table)
    return tta.SamplesToTarget(noise, batch, table[batch], table[batch], table[batch], args.lr_rule or "linear")


def _project_run_dir(args) -> int:
    """`scaling project RUN_DIR`: the user's own job projected (scaling/projection/from_run.py)."""
    import json

    from scaling.projection.from_run import BACKENDS, DEFAULT_GPUS, project_run, run_backend
    from scaling.results import RunDir

    for flag, value in (
        ("--model", args.model),
        ("--from-run", args.from_run),
        ("--nodes", args.nodes),
        ("--samples-per-s", args.samples_per_s),
        ("--noise-scale", args.noise_scale),
    ):
        if value is not None:
            raise UsageError(f"{flag} does not go with a run directory (the run is the model and the compute)")
    if args.backend is not None and args.backend not in BACKENDS:
        raise UsageError(f"a run directory projects with --backend {' or '.join(BACKENDS)}, not {args.backend}")
    if args.gpus is not None and args.workers is not None:
        raise UsageError("give --gpus or --workers, not both")
    # every field the command line set goes to the run's spec, but those project_run takes itself
    # (the backend, how the compute transfers) and FSDP's own, which go only with backend fsdp
    own = ("cluster", "workers", "backend", "mfu", "precision", "reshard_after_forward", "fsdp_reduce_dtype")
    kwargs = {k: v for k, v in _spec_values(args).items() if k not in own}
    run = RunDir(args.run_dir)
    backend = args.backend or run_backend(run)
    if backend == "fsdp":
        kwargs.update(reshard_after_forward=args.reshard_after_forward, fsdp_reduce_dtype=args.fsdp_reduce_dtype)
    df = project_run(
        run,
        args.cluster,
        args.gpus or args.workers or DEFAULT_GPUS,
        args.backend,
        compute_ms=args.compute_ms,
        mfu=args.mfu,
        precision=args.precision,
        fsdp_units=args.fsdp_units,
        lr_rule=args.lr_rule,
        **kwargs,
    )
    rows = [{k: console.json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")]
    written = console.write_projection(df, rows, args.out) if args.out is not None else []
    if args.json:
        print(json.dumps(rows, indent=1))
        for name, value, source in df.attrs["parameters"]:
            print(f"set by: {name} = {value}: {source}", file=sys.stderr)
        for line in df.attrs.get("notes", []):
            print(f"note: {line}", file=sys.stderr)
    else:
        console.print_run_projection(df)
    for path in written:
        print(f"written: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _cmd_minicluster(args) -> int:
    from scaling.testbed import minicluster as mc

    if args.action == "exec":
        command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not command:
            raise UsageError(
                "scaling minicluster exec: the command is missing: give it after --, e.g. "
                "-- scaling sweep experiments/quickstart.yaml --workers 2 (see scaling minicluster exec --help)"
            )
        return mc.exec_in(command, args.name, args.node)
    if args.action == "up":
        with mc.signals_raise():  # SIGTERM mid-way: `up` removes what it made, as on Ctrl-C
            cluster = mc.up(
                args.nodes,
                args.bandwidth,
                args.cpus_per_node,
                args.name,
                args.subnet,
                pin_cpus=args.pin_cpus,
                head_cpus=args.head_cpus,
            )
        cap = f", each link capped at {cluster.bandwidth}" if cluster.bandwidth else ", uncapped"
        pinned = "".join(f", node {i} on CPUs {cpus}" for i, cpus in enumerate(cluster.node_cpus) if cpus)
        print(f"minicluster {cluster.name!r} up: {len(cluster.nodes)} nodes{cap}{pinned}")
        print(f"  head {cluster.address}  dashboard/jobs {cluster.dashboard}")
        print(
            "  run inside it: scaling minicluster exec -- scaling sweep experiments/quickstart.yaml --workers "
            f"{len(cluster.nodes) - (cluster.head_cpus == 0)}"
        )
        return 0
    if args.action == "status":
        import json

        print(json.dumps(mc.status(args.name), indent=2))
        return 0
    if args.action == "down":
        mc.down(args.name)
        return 0
    if args.action == "preempt":
        mc.preempt(args.name, args.node)
        print(f"node {args.node} of minicluster {args.name!r} preempted: link down, its processes killed")
        return 0
    if args.action == "rejoin":
        mc.rejoin(args.name, args.node)
        print(f"node {args.node} of minicluster {args.name!r} back: every node alive")
        return 0
    raise AssertionError(f"unhandled minicluster action {args.action!r}")


def _cmd_dashboard(args) -> int:
    from scaling import dashboard

    session_dir = args.session_dir
    if session_dir is None and not dashboard.default_session_dir().is_dir():
        print(f"no Ray session at {dashboard.default_session_dir()}: nothing installed")
        for step in dashboard.manual_steps():
            print(f"  {step}")
        return 0
    session_dir = session_dir or dashboard.default_session_dir()
    target = dashboard.install(session_dir)
    print(f"installed: {target}")
    for step in dashboard.grafana_steps(session_dir):
        print(f"  {step}")
    return 0


def _cmd_run(args) -> int:
    from scaling.config import load_config
    from scaling.launch.preflight import preflight
    from scaling.launch.run import check_run_dir, default_run_name, execute_run, resolve_out

    cfg = load_config(args.config, overrides=args.overrides, num_workers=args.workers)
    run_dir = resolve_out(args.out, default_run_name(cfg))
    check_run_dir(run_dir)
    # the lock first: a second command on a directory being written is refused at once
    with WriterLock(run_dir, "scaling run", wait=args.wait):
        check_run_dir(run_dir)  # again: a writer waited for may have finished a run there
        for note in preflight(cfg, args.launcher):
            print(note, flush=True)
        print(f"run directory: {run_dir}", flush=True)
        summary = execute_run(cfg, run_dir, launcher=args.launcher, preflighted=True)
    console.print_summary(summary, run_dir)
    return 0 if summary["status"] != "failed" else 1


def _cmd_sweep(args) -> int:
    from scaling.launch.preflight import preflight_sweep
    from scaling.launch.run import check_run_dir, resolve_out
    from scaling.launch.sweep import (
        parse_repeats,
        parse_workers,
        plan_more_repeats,
        plan_sweep,
        prepare_sweep_dir,
        run_sweep,
    )

    workers = parse_workers(args.workers) if args.workers is not None else None
    if not 0 < args.interval_width < 1 or args.max_repeats < 2:
        raise UsageError("--interval-width must be in (0, 1) and --max-repeats at least 2")
    data, spec, planned = plan_sweep(args.config, workers, parse_repeats(args.repeats), args.overrides)
    sweep_dir = resolve_out(args.out, f"{planned[0].config.name}-sweep")
    check_run_dir(sweep_dir)
    # the lock first: a second command on a directory being written is refused at once
    with WriterLock(sweep_dir, "scaling sweep", wait=args.wait):
        # Ray's worker logs would tear the progress display; each run's errors land in its summary.
        for note in preflight_sweep(planned, args.launcher, log_to_driver=False):
            print(note, flush=True)
        prepare_sweep_dir(sweep_dir, data, spec)
        screen = console.output_console()
        # plain print: rich would wrap a long path, and job logs are read by scripts
        print(f"sweep directory: {sweep_dir}  ({len(planned)} runs)", flush=True)
        index = run_sweep(sweep_dir, planned, args.launcher, screen)
        while spec.repeats == "auto":
            more, notes = plan_more_repeats(sweep_dir, planned, args.interval_width, args.max_repeats)
            for note in notes:
                print(f"repeats auto: {note}", flush=True)
            if not more:
                break
            planned += more
            index = run_sweep(sweep_dir, planned, args.launcher, screen)
    failed = int((index["status"] == "failed").sum()) if not index.empty else 0
    print(f"done: {len(index) - failed} runs finished, {failed} failed; next: scaling report {sweep_dir}", flush=True)
    return 0 if failed == 0 else 1


def _cmd_compare(args) -> int:
    import json

    from scaling.analysis.compare import worse_beyond_noise
    from scaling.compare import compare_paths, print_comparison

    _, table = compare_paths(args.a, args.b)
    if args.json:
        rows = table.astype(object).where(table.notna(), None).to_dict(orient="records")
        print(json.dumps(rows, indent=1))
    else:
        print_comparison(table, console.output_console(), str(args.a), str(args.b))
    return 1 if worse_beyond_noise(table) else 0


def _cmd_why(args) -> int:
    import json

    from scaling.why import explain, render

    verdict = explain(args.path)
    if args.json:
        print(json.dumps(console.json_value(verdict), indent=1))
    else:
        print("\n".join(render(verdict)))
    return 0


def _cmd_report(args) -> int:
    from scaling.report import write_report

    path = write_report(args.sweep_dirs, console.output_console(), out=args.out, figures=not args.no_figures)
    print(f"report: {path}")
    return 0


# What each command imports from the extras (pyproject.toml), and the extra that brings them all,
# checked before it starts so that it refuses before anything is written; an extra's module imported
# later still ends in the same one line (main).
REQUIRES = {
    "run": (("torch", "ray"), "lab"),
    "sweep": (("torch", "ray"), "lab"),
    "cluster": (("ray",), "lab"),
    "report": (("matplotlib",), "plots"),
}


def _check_extras(args) -> None:
    needed, extra = REQUIRES.get(args.command, ((), None))
    if args.command == "report" and args.no_figures:
        needed = ()
    if args.command == "project" and args.out is not None:
        needed, extra = ("matplotlib",), "plots"  # the figure
    missing = extras.first_missing(needed)
    if missing is not None:
        raise UsageError(extras.refusal(f"scaling {args.command}", missing, extra))


def main(argv: list[str] | None = None) -> int:
    what = "scaling"
    try:
        args = _build_parser().parse_args(argv)
        what = f"scaling {args.command}"
        commands = {
            "run": _cmd_run,
            "sweep": _cmd_sweep,
            "report": _cmd_report,
            "compare": _cmd_compare,
            "why": _cmd_why,
            "minicluster": _cmd_minicluster,
            "project": _cmd_project,
            "cluster": _cmd_cluster,
            "dashboard": _cmd_dashboard,
            "attach": _cmd_attach,
        }
        _check_extras(args)
        return commands[args.command](args)
    except ModuleNotFoundError as exc:
        if extras.missing_extra(exc.name) is None:
            raise  # not an optional extra's module: a real error, with its traceback
        print(f"error: {extras.refusal(what, exc.name)}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        if what.removeprefix("scaling ") not in PRINTING_COMMANDS:
            raise
        # the interpreter flushes stdout again on exit: point it at /dev/null so that flush has nowhere to fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
