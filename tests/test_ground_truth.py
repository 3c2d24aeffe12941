"""Ground truth for the communication figures: inject a known delay, see it measured.

`instrument.inject_comm_delay_s = D` holds the last gradient bucket's all-reduce for D
seconds per step, inside the all-reduce path. The same 2-worker run with and without it
must show the exposed communication per step, and the A/B (sync - no_sync) difference,
each grown by D within +-15%. Runs under the plain launcher (the same loop as under Ray)
to spare two Ray start-ups.
"""

import pytest

from scaling.config import load_config
from scaling.launch.run import execute_run
from tests.conftest import REPO

INJECTED_S = 0.12


def _run(tmp_path, delay_s: float) -> dict:
    cfg = load_config(
        REPO / "experiments" / "quickstart.yaml",
        overrides=[
            "data.train_samples=2048", "data.val_samples=256", "train.max_epochs=2",
            "train.target_accuracy=1.0", "instrument.calibration_pairs=16",
            f"instrument.inject_comm_delay_s={delay_s}",
        ],
        num_workers=2,
    )
    summary = execute_run(cfg, tmp_path / f"delay{delay_s}", launcher="local")
    assert summary["status"] == "max_epochs", summary["error"]
    return summary


def test_injected_delay_is_measured_by_exposed_comm_and_ab(tmp_path):
    base = _run(tmp_path, 0.0)
    injected = _run(tmp_path, INJECTED_S)
    exposed_growth = injected["exposed_comm_s"] - base["exposed_comm_s"]
    ab_growth = injected["comm_delta_s"] - base["comm_delta_s"]
    print(f"injected {INJECTED_S:.3f} s: exposed grew {exposed_growth:.4f} s, A/B grew {ab_growth:.4f} s")
    assert exposed_growth == pytest.approx(INJECTED_S, rel=0.15)
    assert ab_growth == pytest.approx(INJECTED_S, rel=0.15)
    # the step time carries the delay too: the instrument is not measuring itself
    assert injected["step_s"] - base["step_s"] == pytest.approx(INJECTED_S, rel=0.15)
