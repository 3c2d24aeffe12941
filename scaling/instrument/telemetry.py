"""GPU telemetry: a background thread sampling one GPU through NVML (nvidia-ml-py) during a run.

Each sample is one row (definitions, once, here; every figure is NVML's, for the whole device,
whichever processes use it):

- `time`: unix seconds when the sample was read; `elapsed_s`: seconds since `start()`.
- `gpu_util_pct`: percent of NVML's last sample period (1/6 s to 1 s, by product) during which
  at least one kernel was running. Not SM occupancy: one small kernel at a time reads 100%.
- `mem_used_bytes`: device memory in use (all processes, CUDA contexts included).
- `power_w`: board power draw in watts; on Ampere (except A100) and newer NVML reports a
  1-second average, on A100 and older an instantaneous reading.
- `sm_clock_mhz`: current SM clock; `temperature_c`: GPU core temperature.
- `sample_s`: how long the NVML reads of this sample took (the sampler's own cost).
- `device_index`: the torch (CUDA) index of the sampled device, which under
  CUDA_VISIBLE_DEVICES is not NVML's index; `start_telemetry` finds the NVML device by UUID.

A field the device does not support (power on some boards) is None.

Cost: a sample is five NVML queries (tens of microseconds each) on a daemon thread that sleeps
between samples, so it competes with the training loop for the GIL only while reading. Its
effect on step time is not assumed but measured: a benchmark runs the same steps with the
sampler on and off.

The read function is injectable (`read=`), so the thread, stop and drain logic is tested
without a GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

FIELDS = ("gpu_util_pct", "mem_used_bytes", "power_w", "sm_clock_mhz", "temperature_c")


def telemetry_available() -> tuple[bool, str]:
    """Whether NVML can be used here, and a one-line reason when it cannot. Never raises."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return False, "GPU telemetry unavailable: nvidia-ml-py is not installed; the run proceeds without it"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return False, "GPU telemetry unavailable: NVML not found (no NVIDIA driver); the run proceeds without it"
    except Exception as e:  # noqa: BLE001 - driver present but NVML refuses: say why, carry on
        return False, f"GPU telemetry unavailable: NVML failed to initialise ({e}); the run proceeds without it"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:  # noqa: BLE001
        return False, f"GPU telemetry unavailable: NVML cannot list devices ({e}); the run proceeds without it"
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        return False, "GPU telemetry unavailable: NVML sees no GPU; the run proceeds without it"
    return True, f"GPU telemetry available: NVML sees {count} GPU(s)"


class NvmlReader:
    """Reads one GPU's telemetry fields through NVML. Call it for a sample; `close()` after.

    The device is chosen by NVML index or, preferably, by UUID, which is immune to
    CUDA_VISIBLE_DEVICES and device ordering. NVML wants its UUIDs prefixed: "GPU-" for a
    whole GPU, "MIG-" for a MIG instance; torch reports the UUID without a prefix (for a MIG
    instance, the instance's own UUID), so an unprefixed one is looked up as a GPU, then as a
    MIG instance. `uuid` is the UUID NVML matched.
    """

    def __init__(self, nvml_index: int | None = None, uuid: str | None = None):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()  # reference-counted by NVML: balanced by close()
        try:
            if uuid is not None:
                self._handle, self.uuid = self._by_uuid(uuid)
            else:
                self._handle, self.uuid = pynvml.nvmlDeviceGetHandleByIndex(nvml_index or 0), None
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def _by_uuid(self, uuid: str):
        candidates = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
        first_error = None
        for candidate in candidates:
            try:
                return self._nvml.nvmlDeviceGetHandleByUUID(candidate), candidate
            except self._nvml.NVMLError as exc:  # not a device of this kind: try the next prefix
                first_error = first_error or exc
        raise first_error

    def _query(self, fn, *args):
        try:
            return fn(self._handle, *args)
        except self._nvml.NVMLError:  # e.g. NOT_SUPPORTED on this board: that field is None
            return None

    def __call__(self) -> dict:
        nvml = self._nvml
        util = self._query(nvml.nvmlDeviceGetUtilizationRates)
        memory = self._query(nvml.nvmlDeviceGetMemoryInfo)
        power_mw = self._query(nvml.nvmlDeviceGetPowerUsage)
        return {
            "gpu_util_pct": util.gpu if util is not None else None,
            "mem_used_bytes": memory.used if memory is not None else None,
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "sm_clock_mhz": self._query(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
            "temperature_c": self._query(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        }

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class TelemetrySampler:
    """Samples one device every `interval_s` on a daemon thread; `drain()` takes the rows.

    `read` returns a dict of the telemetry fields; by default an `NvmlReader` of NVML device
    `device_index` (opened at `start()`). If it has a `close()`, `stop()` calls it. A read
    that raises is counted (`errors`, `last_error`) and sampling goes on.
    """

    def __init__(self, device_index: int, interval_s: float = 1.0, read: Callable[[], dict] | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.device_index = device_index
        self.interval_s = interval_s
        self._read = read
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0
        self._closed = False
        self.errors = 0
        self.last_error: str | None = None

    def start(self) -> TelemetrySampler:
        if self._thread is not None:
            raise RuntimeError("TelemetrySampler already started")
        if self._read is None:
            self._read = NvmlReader(nvml_index=self.device_index)
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"telemetry-gpu{self.device_index}", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        before = time.perf_counter()
        try:
            fields = self._read()
        except Exception as e:  # noqa: BLE001 - one failed read must not end the run's telemetry
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return
        row = {
            "time": time.time(),
            "elapsed_s": time.monotonic() - self._start,
            **{name: fields.get(name) for name in FIELDS},
            "sample_s": time.perf_counter() - before,
            "device_index": self.device_index,
        }
        with self._lock:
            self._rows.append(row)

    def _run(self) -> None:
        # Samples on a fixed schedule (start + k x interval) so that the reads' own time does
        # not make the samples drift; the Event's wait returns as soon as stop() is called.
        k = 0
        while not self._stop.is_set():
            self._sample()
            k += 1
            delay = self._start + k * self.interval_s - time.monotonic()
            if delay < 0:  # a read ran past its slot: skip the missed slots, do not burst
                k += int(-delay // self.interval_s) + 1
                delay = self._start + k * self.interval_s - time.monotonic()
            if self._stop.wait(delay):
                break

    def drain(self) -> list[dict]:
        """The rows sampled since the last drain (oldest first)."""
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling (promptly: the thread is woken, not waited out). Rows stay for `drain()`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        # Close the reader once, and only when no read can still be using it.
        if not self._closed and not self.running:
            close = getattr(self._read, "close", None)
            if close is not None:
                close()
            self._closed = True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _nvml_uuid(device: torch.device) -> str | None:
    try:
        return str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # noqa: BLE001 - older torch or no CUDA: fall back to the index
        return None


def start_telemetry(device: torch.device | str, interval_s: float) -> tuple[TelemetrySampler | None, str]:
    """A started sampler for `device`, or None, with a one-line reason either way.

    None for a CPU device, for `interval_s` <= 0 (telemetry off), or where NVML is unavailable.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"GPU telemetry off: {device.type} device"
    if interval_s <= 0:
        return None, f"GPU telemetry off: interval {interval_s} s"
    ok, reason = telemetry_available()
    if not ok:
        return None, reason
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        uuid = _nvml_uuid(torch.device("cuda", index))
        reader = NvmlReader(uuid=uuid) if uuid else NvmlReader(nvml_index=index)
        sampler = TelemetrySampler(index, interval_s, read=reader).start()
    except Exception as e:  # noqa: BLE001 - telemetry is optional: report and carry on
        return None, f"GPU telemetry unavailable: cannot open cuda:{index} in NVML ({e}); the run proceeds without it"
    return sampler, f"GPU telemetry on: cuda:{index} every {interval_s:g} s through NVML"
