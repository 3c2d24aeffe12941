"""Model FLOPs against published counts, device peaks, the CPU peak measurement, and GPU
telemetry: its absent-NVML path on this machine, its sampling thread driven by a fake reader,
and, against a fake NVML library of four GPUs, the lab's own device -> NVML handle lookup (by
UUID under CUDA_VISIBLE_DEVICES, by index without one) and field mapping, so all run without a GPU.

Nothing here assumes how fast this CPU is: the CPU peak's rates are checked as hand-counted
work over a round of a clock the test drives (and its length against its budget on that clock),
and the sampler's schedule against its own clock readings, with waits that only guard against
a hang. The speeds themselves are measurements, not checks."""

from __future__ import annotations

import re
import sys
import threading
import time
import types

import pytest
import torch
from torch import nn

from scaling.analysis.run_metrics import mfu, utilisation
from scaling.instrument import flops, telemetry
from scaling.instrument.flops import (
    device_mem_bandwidth,
    device_peak,
    measure_cpu_peak,
    training_bytes_per_sample,
    training_flops_per_sample,
)
from scaling.instrument.telemetry import FIELDS, TelemetrySampler, start_telemetry, telemetry_available
from scaling.models import build_model

# --- FLOPs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet50_counts():
    model = build_model("resnet50", 1000)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    counts = training_flops_per_sample(model, (3, 224, 224), 1000)
    return model, before, counts


def test_resnet50_forward_flops_match_published_gmacs(resnet50_counts):
    _, _, counts = resnet50_counts
    # 4.09 GMAC (torchvision's model card: 4.09 GFLOPS, counted as multiply-adds); a
    # multiply-add is 2 FLOPs in FlopCounterMode.
    assert counts["forward_flops"] == pytest.approx(2 * 4.09e9, rel=0.02)
    assert counts["method"] == "FlopCounterMode"
    assert counts["counted_on"] == "meta"
    assert counts["parameters"] == 25_557_032


def test_resnet50_train_flops_about_three_times_forward(resnet50_counts):
    _, _, counts = resnet50_counts
    # Backward is 2x forward for every conv/linear except the stem conv, whose input (the
    # images) needs no gradient: only its weight gradient is computed. Exactly:
    # train = 3 x forward - stem conv's forward (7x7x3x64 x 112x112 MACs = 236 MFLOP).
    stem = 2 * 7 * 7 * 3 * 64 * 112 * 112
    assert counts["train_flops"] == 3 * counts["forward_flops"] - stem
    assert 2.9 < counts["train_to_forward"] < 3.1  # 2.971
    assert counts["backward_flops"] == counts["train_flops"] - counts["forward_flops"]


def test_counting_leaves_the_model_untouched(resnet50_counts):
    model, before, _ = resnet50_counts
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_small_cnn_counts():
    model = build_model("small_cnn", 10).eval()
    counts = training_flops_per_sample(model, (3, 32, 32), 10)
    assert not model.training  # counting trains a copy; the caller's mode is kept
    # Convs 3->16 @32x32, 16->32 @16x16, 32->64 @8x8 (3x3) + linear 1024->256->10, in MACs x2.
    convs = 2 * 9 * (3 * 16 * 32 * 32 + 16 * 32 * 16 * 16 + 32 * 64 * 8 * 8)
    linears = 2 * (1024 * 256 + 256 * 10)
    assert counts["forward_flops"] == convs + linears
    assert counts["train_flops"] > 2.5 * counts["forward_flops"]
    assert counts["activation_elements"] > 0


class _NeedsRealData(nn.Module):
    """`.item()` has no meaning on the meta device: counting must fall back to a CPU copy."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        return self.fc(x.flatten(1)) * float(x.abs().max().item() > 0)


def test_falls_back_to_a_real_batch_when_meta_fails():
    counts = training_flops_per_sample(_NeedsRealData(), (3, 2, 2), 5)
    assert counts["counted_on"].startswith("cpu (meta device failed")
    assert counts["forward_flops"] == 2 * 12 * 5
    # The only layer is the first: its input needs no gradient, so backward is the weight
    # gradient alone, one matmul the size of forward's (as for ResNet-50's stem).
    assert counts["train_flops"] == 2 * counts["forward_flops"]


def test_bytes_per_sample_estimate():
    counts = {"activation_elements": 1000, "parameters": 100, "train_flops": 6e6}
    fp32 = training_bytes_per_sample(counts, batch_size=10)
    # 5 passes over activations, 3 + 5 (SGD momentum) over parameters, shared by the batch.
    assert fp32["bytes_per_sample"] == 5 * 1000 * 4 + 8 * 100 * 4 / 10
    assert fp32["arithmetic_intensity"] == pytest.approx(6e6 / fp32["bytes_per_sample"])
    half = training_bytes_per_sample(counts, batch_size=10, bytes_per_element=2)
    assert half["activation_bytes_per_sample"] == fp32["activation_bytes_per_sample"] / 2
    assert training_bytes_per_sample(counts, batch_size=1000)["bytes_per_sample"] < fp32["bytes_per_sample"]
    with pytest.raises(ValueError):
        training_bytes_per_sample(counts, batch_size=0)


# --- peaks and MFU ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H200", "bf16", 989.4e12),
        ("nvidia h200", "fp16", 989.4e12),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7e12),
        ("NVIDIA H100 80GB HBM3", "fp32", 67e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100-SXM4-40GB", "tf32", 156e12),
        ("Tesla V100-SXM2-16GB", "fp16", 125e12),
        ("Tesla V100-SXM2-32GB", "fp32", 15.7e12),
    ],
)
def test_device_peaks(name, precision, expected):
    peak, note = device_peak(name, precision)
    assert peak == expected
    assert note


def test_fp32_peak_says_what_torch_runs_in_tf32():
    _, note = device_peak("NVIDIA H200", "fp32")
    assert "TF32" in note or "fp32 matmuls in fp32 and cuDNN convolutions in fp32" in note


@pytest.mark.parametrize(
    ("name", "precision"),
    [
        ("Tesla T4", "fp16"),  # not in the table
        ("NVIDIA H100 PCIe", "bf16"),  # another variant of a known part: no borrowed peak
        ("NVIDIA GH200 480GB", "bf16"),
        ("NVIDIA H200 NVL", "bf16"),
        ("Tesla V100-SXM2-16GB", "bf16"),  # V100 has no bf16
        ("NVIDIA H200", "fp8"),  # precision not in the table
    ],
)
def test_no_peak_without_a_datasheet_number(name, precision):
    peak, reason = device_peak(name, precision)
    assert peak is None
    assert reason


def test_memory_bandwidths():
    assert device_mem_bandwidth("NVIDIA H200")[0] == 4800e9
    assert device_mem_bandwidth("NVIDIA A100-SXM4-80GB")[0] == 2039e9
    assert device_mem_bandwidth("NVIDIA A100-SXM4-40GB")[0] == 1555e9
    assert device_mem_bandwidth("Tesla T4")[0] is None


def test_mfu_against_hand_computed_values_and_never_above_one():
    # ResNet-50 at 1,000 images/s on an H100's bf16 peak: 24.3e12 / 989.4e12 = 0.02456
    assert mfu(24.3e9 * 1000, 989.4e12) == (pytest.approx(0.02456, rel=1e-3), None)
    # An achieved rate above the "peak" (an emulated-bf16 matmul rate on a CPU without native
    # bf16: 0.93 GFLOP/s against 3.0 achieved) gives no MFU, with the reason, never 3.2.
    ratio, why = mfu(3.0e9, 0.93e9)
    assert ratio is None and "exceeds the peak" in why
    assert mfu(None, 1e9)[0] is None and mfu(1e9, None)[0] is None
    # utilisation(): achieved per worker = flops x samples/s / workers = 2e6 x 600 / 2 = 6e8 FLOP/s;
    # against a 1.2e9 peak: MFU 0.5; against a 5e8 peak (below achieved): absent, with its note.
    fields = utilisation(600.0, 2, {"train_flops": 2e6, "peak_flops_per_s": 1.2e9, "train_bytes_per_sample": 4e5})
    assert fields["achieved_flops_per_s"] == pytest.approx(6e8)
    assert fields["mfu"] == pytest.approx(0.5) and fields["mfu_note"] is None
    assert fields["arithmetic_intensity"] == pytest.approx(5.0)  # 2e6 FLOPs / 4e5 bytes
    fields = utilisation(600.0, 2, {"train_flops": 2e6, "peak_flops_per_s": 5e8})
    assert fields["mfu"] is None and "exceeds the peak" in fields["mfu_note"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_peak_is_the_fastest_kernel_in_the_run_precision_or_more_exact(dtype):
    threads_before = torch.get_num_threads()
    peak = measure_cpu_peak(threads=1, seconds=0.2, dtype=dtype)
    assert torch.get_num_threads() == threads_before and peak["threads"] == 1
    kernels = peak["kernel_flops_per_s"]
    assert peak["peak_flops"] == max(kernels.values())
    names = set(kernels)
    assert {"float32 matmul", "float32 conv3x3"} <= names  # fp32 carries every precision's arithmetic
    if dtype == torch.bfloat16:
        assert {"bfloat16 matmul", "bfloat16 conv3x3"} <= names
    else:
        assert not any(name.startswith("bfloat16") for name in names)
    for name, rate in kernels.items():
        assert f"{name} {rate / 1e9:.3g}" in peak["method"]
    assert all(rate > 0 for rate in kernels.values()) and peak["mem_bytes_per_s"] > 0  # speeds: bench/, not here


class _TickingClock:
    """A stand-in for `time.perf_counter` in flops.py: every reading is one tick after the last.

    A tick is a power of two, so readings and their differences are exact in floating point.
    A measured round (its start and end are consecutive readings) then lasts exactly one tick,
    and each rate is the round's hand-countable work over one tick, whatever the CPU's speed.
    """

    TICK_S = 1 / 64

    def __init__(self):
        self.readings = 0

    def perf_counter(self) -> float:
        self.readings += 1
        return self.readings * self.TICK_S


def test_measure_cpu_peak_rates_are_counted_work_over_measured_time_within_its_budget(monkeypatch):
    clock = _TickingClock()
    monkeypatch.setattr(flops, "time", clock)
    measure_cpu_peak.cache_clear()  # measured on the ticking clock, not taken from an earlier call
    threads_before = torch.get_num_threads()
    seconds = 0.25
    peak = measure_cpu_peak(threads=1, seconds=seconds)
    tick = clock.TICK_S
    # Each kernel's rate is its FLOPs per round, counted by hand, over the round's measured time:
    # two 1024^3 matmuls per round (2 x 1024^3 multiply-adds each); one 3x3 convolution of
    # 64 -> 64 channels on 8 x 56 x 56 maps (8 x 64 x 64 x 9 x 56 x 56 multiply-adds).
    matmul = 2 * (2 * 1024**3)
    conv = 2 * (8 * 64 * 64 * 9 * 56 * 56)
    assert peak["kernel_flops_per_s"] == {"float32 matmul": matmul / tick, "float32 conv3x3": conv / tick}
    assert peak["peak_flops"] == matmul / tick
    # the copy: bytes read + written per round (the source and its copy) over the round's time
    copied_mib = int(re.search(r"copy of (\d+) MiB", peak["method"]).group(1))
    assert 64 <= copied_mib <= 512
    assert peak["mem_bytes_per_s"] == 2 * (copied_mib << 20) / tick
    # Within its budget, on its own clock: `seconds` for the kernels (half each) and half again
    # for the copy; each measurement may overrun its deadline by the one round (3 readings:
    # the deadline check, the round's start and end) that crosses it, and reads the clock once
    # to set the deadline.
    measurements, budget_s = 3, 1.5 * seconds
    assert budget_s <= clock.readings * tick <= budget_s + measurements * 4 * tick
    assert peak["threads"] == 1 and torch.get_num_threads() == threads_before
    assert peak["method"].startswith("measured")


# --- telemetry --------------------------------------------------------------------------------


def test_telemetry_unavailable_without_nvml():
    if telemetry_available()[0]:
        pytest.skip("NVML is present on this machine")
    ok, reason = telemetry_available()
    assert not ok
    assert reason.startswith("GPU telemetry unavailable")
    sampler, why = start_telemetry(torch.device("cuda", 0), 1.0)
    assert sampler is None and why == reason


def test_start_telemetry_is_off_for_cpu_and_non_positive_intervals():
    assert start_telemetry(torch.device("cpu"), 1.0)[0] is None
    assert start_telemetry("cpu", 1.0)[1] == "GPU telemetry off: cpu device"
    assert start_telemetry("cuda:0", 0)[0] is None
    assert start_telemetry("cuda:0", -1)[0] is None


class _FakeReader:
    """A reader that counts its calls, fails on the calls in `fail_on`, and on the calls in
    `stall_on` takes that many seconds (a read that runs past its slot)."""

    def __init__(self):
        self.calls = 0
        self.closed = False
        self.fail_on = set()
        self.stall_on: dict[int, float] = {}

    def __call__(self):
        self.calls += 1
        if self.calls in self.stall_on:
            time.sleep(self.stall_on[self.calls])
        if self.calls in self.fail_on:
            raise RuntimeError("transient")
        return {
            "gpu_util_pct": self.calls,
            "mem_used_bytes": 1 << 30,
            "power_w": 300.0,
            "sm_clock_mhz": 1980,
            "temperature_c": 50,
        }

    def close(self):
        self.closed = True


# Waits below are for a thread to do something at all, not for it to be quick: a hang guard
# no scheduling delay comes near, never a timing check.
HANG_GUARD_S = 60.0
# Event.wait may return a hair before its deadline (the clock's rounding): a read is "in its
# slot" from this much before the slot's start. Load only ever makes reads later.
EARLY_WAKE_S = 0.002


def _wait_until(predicate, what: str):
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, f"the sampler never {what}"
        time.sleep(0.005)


def test_sampler_samples_on_schedule_drains_and_stops_promptly():
    interval_s = 0.02
    reader = _FakeReader()
    reader.fail_on = {2}
    reader.stall_on = {4: 3.5 * interval_s}  # runs past three slots: those are skipped, not caught up in a burst
    started_unix, started = time.time(), time.monotonic()
    sampler = TelemetrySampler(device_index=3, interval_s=interval_s, read=reader).start()
    assert sampler.running
    _wait_until(lambda: reader.calls >= 8, "read 8 times")
    first = sampler.drain()
    drained = time.monotonic()
    # A long interval must not delay stop(): the thread waits on an Event, not in sleep(). Once a
    # read has begun after the change, the thread's next wait is hours long; a thread that slept
    # it out would still be running after stop() has waited 30 s for it.
    sampler.interval_s = 3600.0
    calls_at_change = reader.calls
    _wait_until(lambda: reader.calls > calls_at_change, "read after the interval changed")
    sampler.stop(timeout_s=30.0)
    assert not sampler.running
    assert reader.closed
    second = sampler.drain()
    assert sampler.drain() == []
    finished_unix = time.time()

    rows = first + second
    assert sampler.errors == 1 and sampler.last_error == "RuntimeError: transient"
    assert [r["gpu_util_pct"] for r in rows] == [1] + list(range(3, reader.calls + 1))  # oldest first, no loss
    assert len(rows) == reader.calls - 1
    assert set(rows[0]) == {"time", "elapsed_s", *FIELDS, "sample_s", "device_index"}
    assert all(r["device_index"] == 3 for r in rows)
    # the row's time is the wall clock of its read, its elapsed_s the sampler's own clock since start
    assert all(started_unix <= r["time"] <= finished_unix for r in rows)
    assert all(0 <= r["elapsed_s"] <= drained - started for r in first)
    # On schedule. A row's elapsed_s is taken just after its read, so the read began in or
    # before that slot (`ended`) and, allowing an early wake-up, in or after `began`. Call k is
    # never read before slot k - 1, and each read begins in a slot after the one where the
    # previous read ended: the stalled read (call 4) ended three slots past its own, and a
    # sampler that then caught up on the missed slots would read them at once, in the slot where
    # the stall ended. So the reads up to the drain number at most the slots begun by then.
    ended = [int(r["elapsed_s"] // interval_s) for r in first]
    began = [int((r["elapsed_s"] + EARLY_WAKE_S) // interval_s) for r in first]
    calls = [r["gpu_util_pct"] for r in first]
    assert all(slot >= call - 1 for slot, call in zip(began, calls))
    assert all(later > earlier for earlier, later in zip(ended, began[1:]))
    assert ended[calls.index(4)] >= 3 + 3
    assert len(first) + sampler.errors <= (drained - started + EARLY_WAKE_S) / interval_s + 1
    assert not any(t.name == "telemetry-gpu3" for t in threading.enumerate())


def test_sampler_rejects_non_positive_interval_and_double_start():
    with pytest.raises(ValueError):
        TelemetrySampler(0, interval_s=0)
    reader = _FakeReader()
    sampler = TelemetrySampler(0, interval_s=3600, read=reader).start()
    try:
        with pytest.raises(RuntimeError):
            sampler.start()
        _wait_until(lambda: reader.calls >= 1, "read at start")  # not an interval (an hour) later
    finally:
        sampler.stop()
    assert len(sampler.drain()) == 1  # the sample taken at start


# NVML: only the library is faked. A fake pynvml of four GPUs, each with its own handle, UUID and
# readings, so that opening the wrong device reads visibly wrong numbers; the device -> handle
# lookup (by UUID or NVML index) and the field mapping are the lab's own code, run as they are.
# NVML device 1 is a MIG instance ("MIG-" UUID); the others are whole GPUs ("GPU-").
NVML_UUIDS = (
    "GPU-0a0a0a0a-0000-4000-8000-000000000000",
    "MIG-1b1b1b1b-1111-4111-8111-111111111111",
    "GPU-2c2c2c2c-2222-4222-8222-222222222222",
    "GPU-3d3d3d3d-3333-4333-8333-333333333333",
)


def _fake_pynvml(unsupported_power: bool = False):
    """Just enough of nvidia-ml-py (same names, same errors) for NvmlReader and start_telemetry."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotFound(NVMLError):  # noqa: N801 - pynvml's name
        pass

    class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
        pass

    class Handle:  # opaque to the caller, as pynvml's c_nvmlDevice_t
        def __init__(self, index):
            self.index = index

    handles = [Handle(i) for i in range(len(NVML_UUIDS))]
    state = {"inits": 0, "opened": []}

    def init():
        state["inits"] += 1

    def shutdown():
        state["inits"] -= 1

    def by_index(index):
        if not 0 <= index < len(handles):
            raise NVMLError_InvalidArgument("Invalid Argument")
        state["opened"].append(("index", index))
        return handles[index]

    def by_uuid(uuid):
        state["opened"].append(("uuid", uuid))
        if uuid not in NVML_UUIDS:  # NVML wants the exact string, "GPU-"/"MIG-" prefix included
            raise NVMLError_NotFound("Not Found")
        return handles[NVML_UUIDS.index(uuid)]

    def power(handle):
        if unsupported_power:
            raise NVMLError("Not Supported")
        return 100_000 + 1000 * handle.index  # milliwatts

    # device i reads: utilisation 10 + i %, (i + 1) GiB used, 100 + i W, 1000 + i MHz, 40 + i C
    module = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_NotFound=NVMLError_NotFound,
        NVMLError_InvalidArgument=NVMLError_InvalidArgument,
        NVMLError_LibraryNotFound=type("NVMLError_LibraryNotFound", (NVMLError,), {}),
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlDeviceGetCount=lambda: len(handles),
        nvmlDeviceGetHandleByIndex=by_index,
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=10 + h.index, memory=5),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=(h.index + 1) << 30, total=80 << 30),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetClockInfo=lambda h, clock: 1000 + h.index if clock == 1 else 0,
        nvmlDeviceGetTemperature=lambda h, sensor: 40 + h.index if sensor == 0 else -1,
    )
    return module, state


def _readings(i: int) -> dict:
    """What the fake NVML device i reads, in the sampler's fields."""
    return {
        "gpu_util_pct": 10 + i,
        "mem_used_bytes": (i + 1) << 30,
        "power_w": 100.0 + i,
        "sm_clock_mhz": 1000 + i,
        "temperature_c": 40 + i,
    }


@pytest.fixture
def fake_nvml(monkeypatch):
    fake, state = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return state


def test_nvml_reader_opens_the_device_by_uuid_or_index(fake_nvml):
    # torch reports a UUID without NVML's "GPU-" prefix: the reader adds it and finds device 2
    reader = telemetry.NvmlReader(uuid="2c2c2c2c-2222-4222-8222-222222222222")
    assert reader() == _readings(2) and fake_nvml["opened"][-1] == ("uuid", NVML_UUIDS[2])
    reader.close()
    # a prefixed UUID, GPU or MIG, is passed on as it is
    for i in (3, 1):
        reader = telemetry.NvmlReader(uuid=NVML_UUIDS[i])
        assert reader() == _readings(i) and fake_nvml["opened"][-1] == ("uuid", NVML_UUIDS[i])
        reader.close()
    # without a UUID: NVML's index, 0 by default
    for index, expected in ((1, 1), (None, 0)):
        reader = telemetry.NvmlReader(nvml_index=index)
        assert reader() == _readings(expected) and fake_nvml["opened"][-1] == ("index", expected)
        reader.close()
    # a UUID NVML does not know is NVML's error, and leaves NVML shut down as it found it
    with pytest.raises(sys.modules["pynvml"].NVMLError_NotFound):
        telemetry.NvmlReader(uuid="GPU-ffffffff-0000-4000-8000-000000000000")
    assert fake_nvml["inits"] == 0


def test_nvml_reader_reports_an_unsupported_field_as_none(monkeypatch):
    fake, state = _fake_pynvml(unsupported_power=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = telemetry.NvmlReader(nvml_index=3)
    assert reader() == {**_readings(3), "power_w": None}
    reader.close()
    assert state["inits"] == 0


class _CudaUuid:
    """As torch's _CUuuid: str() is the UUID without NVML's "GPU-" prefix."""

    def __init__(self, nvml_uuid: str):
        self._text = nvml_uuid.split("-", 1)[1]

    def __str__(self):
        return self._text


def _first_rows(sampler) -> list[dict]:
    rows = []
    try:
        while not rows:  # the sampler reads once on start; wait for that row (no timing asserted)
            rows = sampler.drain()
            time.sleep(0.005)
    finally:
        sampler.stop()
    return rows + sampler.drain()


def test_start_telemetry_samples_the_torch_device_s_own_gpu(fake_nvml, monkeypatch):
    # Under CUDA_VISIBLE_DEVICES=3,2 torch's cuda:0 is NVML's device 3 and cuda:1 is device 2.
    # Only what the CUDA runtime would answer (each torch device's properties) is stubbed here.
    visible = {0: 3, 1: 2}
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: types.SimpleNamespace(uuid=_CudaUuid(NVML_UUIDS[visible[device.index]])),
    )
    for torch_index, nvml_index in visible.items():
        sampler, reason = start_telemetry(torch.device("cuda", torch_index), 0.01)
        assert sampler is not None and reason == f"GPU telemetry on: cuda:{torch_index} every 0.01 s through NVML"
        rows = _first_rows(sampler)
        # readings of NVML device 3 (then 2), not of NVML device 0 (1) that the torch index names
        assert all({k: r[k] for k in FIELDS} == _readings(nvml_index) for r in rows)
        assert all(r["device_index"] == torch_index for r in rows)  # rows keep the torch index
        assert fake_nvml["opened"][-1] == ("uuid", NVML_UUIDS[nvml_index])
    assert fake_nvml["inits"] == 0  # every nvmlInit balanced by an nvmlShutdown


def test_start_telemetry_without_a_uuid_or_with_an_unknown_one(fake_nvml, monkeypatch):
    # A torch without device UUIDs: NVML's device of the same index (right without CUDA_VISIBLE_DEVICES)
    def no_uuid(device):
        raise AttributeError("'_CudaDeviceProperties' object has no attribute 'uuid'")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_uuid)
    sampler, _ = start_telemetry(torch.device("cuda", 1), 0.01)
    rows = _first_rows(sampler)
    assert all({k: r[k] for k in FIELDS} == _readings(1) for r in rows)
    assert fake_nvml["opened"][-1] == ("index", 1)
    # A UUID NVML does not list: no telemetry, one line saying why; the run goes on
    unknown = _CudaUuid("GPU-ffffffff-0000-4000-8000-000000000000")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid=unknown))
    sampler, reason = start_telemetry(torch.device("cuda", 0), 0.01)
    assert sampler is None
    assert reason.startswith("GPU telemetry unavailable: cannot open cuda:0 in NVML (Not Found)") and "\n" not in reason
    assert fake_nvml["inits"] == 0
