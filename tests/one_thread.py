"""A module fixture for tests that run torch in the test process: one intra-op thread.

    from tests.one_thread import one_torch_thread  # noqa: F401  (autouse, module scope)

torch defaults to a thread per core. On a loaded 2-core machine its two threads wait on each
other at every parallel region while the other is off its core: a forward and backward of
resnet101 (64x64) and amoebanet_d_6_64 (32x32) at batch 2 took 17.4-18.7 s with 2 threads at
load average 9, and 1.36 s with one (two runs each, alternating). The lab's own workers run one
thread per reserved CPU for the same reason (scaling/train/loop.py, `set_cpu_threads`).
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
