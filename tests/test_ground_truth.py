"""Ground truth for the communication figures: inject a known delay, see it measured.

`instrument.inject_comm_delay_s = D` holds the last gradient bucket's all-reduce for D
seconds per step, inside the all-reduce path. The same 2-worker run with and without it
must show each of these grown by D within +-15%:
- the exposed communication per step (the all-reduce hook's marks);
- the A/B (sync - no_sync) difference of the calibration window;
- the backward phase as the loop's own clock times it (marks around `loss.backward()`,
  independent of the hook's; DDP returns from backward only once the all-reduce completed):
  the instrument is not measuring itself.
Runs under the plain launcher (the same loop as under Ray) to spare two Ray start-ups.

Each figure is taken from the run's least-disturbed observations: its fastest steady-state
step, and for the A/B its fastest synchronised calibration half minus its fastest no_sync
half. On a shared 2-core machine other processes only ever add time to a step, and they add
more to the run that sleeps D per step (it gives its core away and waits to get it back) than
to the one that never sleeps, so the two runs' means compare two different loads.

Measured here (growth minus D, as a share of D), base/injected pairs of runs, quiet and under
load (other projects' Ray runs and tests, two busy loops on the 2 cores; load average up to 9,
the base run's mean step up to 18x its quiet 28 ms):
                          D = 0.5 s (28 pairs)        D = 1.0 s (12 pairs)
    exposed comm          -0.3..+0.1%                 -0.1..+0.1%
    A/B                   -4.1..+8.3%                 -5.5..+0.5%
    backward phase        -8.4..+5.3% (23 pairs)      -1.5..+0.9%
    whole step            -11.6..+8.5%                -14.0..+1.4%
    the runs' means       step -41..+25%, exposed -16..+18%, comm_delta_s -28..+50% (D = 0.5 s)
The whole step also holds the forward pass, whose fastest instance a starved base run never
shows, hence the backward phase as the hook-independent figure (the step is printed, not
checked). The checked figures moved by up to 42 ms at D = 0.5 s, a margin of 1.8 to the 15%;
hence D = 1.0 s, where the worst seen (5.5%) leaves 2.7 (at the earlier D = 0.12 s, 20 ms was
17% of D). Few steps keep the injected run short: 8 per epoch, 4 calibration pairs, 24 s of delay.
"""

import pandas as pd
import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO

INJECTED_S = 1.0
EPOCHS, STEPS_PER_EPOCH, PAIRS, WARMUP = 2, 8, 4, 5


def _run(tmp_path, delay_s: float) -> dict:
    cfg = load_config(
        REPO / "experiments" / "quickstart.yaml",
        overrides=[
            f"data.train_samples={2 * 64 * STEPS_PER_EPOCH}",
            "data.val_samples=256",
            f"train.max_epochs={EPOCHS}",
            "train.target_accuracy=1.0",
            f"instrument.calibration_pairs={PAIRS}",
            f"instrument.warmup_steps={WARMUP}",
            f"instrument.inject_comm_delay_s={delay_s}",
        ],
        num_workers=2,
    )
    run_dir = tmp_path / f"delay{delay_s}"
    summary = execute_run(cfg, run_dir, launcher="local")
    assert summary["status"] == "max_epochs", summary["error"]
    steps = pd.read_parquet(run_dir / "steps.parquet")  # a file, or a directory of parts: read whole either way
    train = steps[(steps["kind"] == "train") & ~steps["warmup"]]
    calib = steps[steps["kind"] != "train"]
    assert len(train) == 2 * (EPOCHS * STEPS_PER_EPOCH - WARMUP)  # ranks x steady steps
    assert len(calib) == 2 * EPOCHS * 2 * PAIRS  # ranks x epochs x halves x pairs
    fastest_sync = calib.loc[calib["kind"] == "calib_sync", "step_s"].min()
    fastest_nosync = calib.loc[calib["kind"] == "calib_nosync", "step_s"].min()
    return {
        "exposed_comm_s": train["exposed_comm_s"].min(),
        "ab_s": fastest_sync - fastest_nosync,
        "backward_s": train["backward_s"].min(),
        "step_s": train["step_s"].min(),  # reported, not checked (see the module docstring)
        "summary": summary,
    }


def test_injected_delay_is_measured_by_exposed_comm_and_ab(tmp_path):
    base = _run(tmp_path, 0.0)
    injected = _run(tmp_path, INJECTED_S)
    growth = {name: injected[name] - base[name] for name in ("exposed_comm_s", "ab_s", "backward_s", "step_s")}
    means = {
        name: injected["summary"][name] - base["summary"][name] for name in ("step_s", "exposed_comm_s", "comm_delta_s")
    }
    print(
        f"injected {INJECTED_S:.3f} s; growth of the fastest: "
        + ", ".join(f"{k} {v:.4f} s" for k, v in growth.items())
        + "; of the summary's figures: "
        + ", ".join(f"{k} {v:.4f} s" for k, v in means.items())
    )
    assert growth["exposed_comm_s"] == pytest.approx(INJECTED_S, rel=0.15)
    assert growth["ab_s"] == pytest.approx(INJECTED_S, rel=0.15)
    # the loop's own clock carries the delay too: the instrument is not measuring itself
    assert growth["backward_s"] == pytest.approx(INJECTED_S, rel=0.15)
