"""Peak memory of one rank over an epoch's training: what sharding saves, measured where it is spent.

- GPU: `torch.cuda.max_memory_allocated` of the rank's device, the caching allocator's peak of
  memory held by tensors (not the allocator's reserve, nor the CUDA context), reset at the
  epoch's start with `torch.cuda.reset_peak_memory_stats`. Reading it does not synchronise.
- CPU: the process's resident high-water mark, `VmHWM` of /proc/self/status (Linux), reset at
  the epoch's start by writing 5 to /proc/self/clear_refs where the kernel allows it (Linux
  4.0 and later); where it does not, the mark is the process's since it started
  (`peak_memory_method` says "VmHWM since start"). Elsewhere `resource.getrusage`'s
  `ru_maxrss` (since start). It counts everything the process holds: the interpreter, torch's
  libraries, the data in memory, the communication buffers, not only the tensors.

`PeakMemory.begin()` at the epoch's first batch, `PeakMemory.end()` when its training ends:
(bytes, method). Evaluation and calibration after the training of an epoch are not in it.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _vm_hwm_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def _ru_maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB on Linux


class PeakMemory:
    """One rank's peak memory per epoch (module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._reset = False

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            _CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident size
            self._reset = True
        except OSError:
            self._reset = False

    def end(self) -> tuple[float, str]:
        """(peak bytes, how it was measured)."""
        if self.cuda:
            return float(torch.cuda.max_memory_allocated(self.device)), "cuda max_memory_allocated"
        hwm = _vm_hwm_bytes()
        if hwm is not None:
            return float(hwm), "VmHWM" if self._reset else "VmHWM since start"
        return float(_ru_maxrss_bytes()), "ru_maxrss since start"
