"""The user's job of examples/own_job run again and again inside one Ray Train run, the instrument's
per-step timing on and off in turn: the runs of bench/instrumentation_overhead.py `--job own`.

`train_func` is the outer run's `train.function` (`scaling run examples/own_job/sweep.yaml
--launcher ray --set train.function=bench.own_job_alternation:train_func ...`). On every worker it
calls the user's `examples.own_job.train.train_func` once per inner run: each a whole run of that
job, its model, `prepare_model`, data loader and `instrument.attach` made afresh, with the
settings `scaling run` hands a user's function (`LaunchedRun`, scaling/instrument/settings.py)
except `step_timing`, which the arm sets, and a run directory of its own (`inner_run_dir`). The
pairs are `bench_pairs` from `bench_first_pair`, in ABBA order (`arm`).

Why inside one run: a pair's two runs then share their worker processes, Ray's processes and
the moment, and differ by what each arm does. (Their ratios spread about as widely as those of
separate Ray Train runs, 0.84 to 1.21 over 48 pairs: under Ray Train the spread is from one
stretch of epochs to the next; docs/benchmarks.md.) A fresh DDP wrap per inner run also means
that no comm hook of an instrumented run is left on a plain one.
"""

from __future__ import annotations

import os

from scaling.instrument.settings import LaunchedRun

ARMS = ("instrumented", "plain")  # step_timing true, false


def arm(pair: int, half: int) -> str:
    """ABBA: even pairs run instrumented then plain, odd pairs the other way round."""
    return ARMS[half] if pair % 2 == 0 else ARMS[1 - half]


def inner_run_dir(outer_run_dir: str, pair: int, half: int) -> str:
    return os.path.join(outer_run_dir, f"pair{pair:03d}-{arm(pair, half)}")


def train_func(config: dict) -> None:
    from examples.own_job.train import train_func as users_train_func

    outer = LaunchedRun.from_environment()
    first, pairs = int(config.pop("bench_first_pair")), int(config.pop("bench_pairs"))
    for pair in range(first, first + pairs):
        for half in (0, 1):
            settings = outer.settings.instrument_only(step_timing=arm(pair, half) == "instrumented")
            run = LaunchedRun(inner_run_dir(outer.run_dir, pair, half), f"{outer.name}-{pair}-{arm(pair, half)}",
                              settings)
            with run.in_environment():
                users_train_func(dict(config))


if __name__ == "__main__":
    # A train function, not a benchmark: run as a script it only says so (and answers --help).
    import argparse

    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The train function bench/instrumentation_overhead.py --job own runs under Ray Train; it measures nothing "
               "itself.").parse_args()
    print("bench/own_job_alternation.py is the train function of bench/instrumentation_overhead.py --job own")
