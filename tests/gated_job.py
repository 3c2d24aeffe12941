"""A model whose construction waits at a gate, for sweeps the test paces (tests/test_writer_lock.py).

`gated_model(num_classes)` is a `model.name` import path: before it returns a linear model over the
quickstart's 3x32x32 images it waits until the file `$SCALING_TEST_GATES/<run key>` exists (the run
key from the run the launcher handed this worker), so the test decides when each run of a sweep
may train, and a second command, a report or a kill lands while a given run is running, whatever
the machine's speed. The sweep's preflight builds the model in the driver, where no gate applies.
"""

import os
import time
from pathlib import Path

from torch import nn

from scaling.instrument.settings import LaunchedRun

GATES_ENV = "SCALING_TEST_GATES"


def gated_model(num_classes):
    run = LaunchedRun.from_environment()
    if run is not None:  # a worker's; the driver's preflight builds one too, ungated
        gate = Path(os.environ[GATES_ENV]) / Path(run.run_dir).name
        while not gate.exists():
            time.sleep(0.05)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))
