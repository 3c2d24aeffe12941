"""Model FLOPs against published counts, device peaks, the CPU peak measurement, and GPU
telemetry: its absent-NVML path on this machine, and its sampling thread driven by a fake
reader (and NVML's field mapping by a fake pynvml), so both run without a GPU."""

from __future__ import annotations

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
    peak = measure_cpu_peak(threads=1, seconds=0.2, dtype=dtype)
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


def test_measure_cpu_peak_is_quick_and_restores_threads():
    threads_before = torch.get_num_threads()
    start = time.perf_counter()
    peak = measure_cpu_peak(threads=1, seconds=0.2)
    assert time.perf_counter() - start < 5  # about 0.6 s here; generous for a loaded machine
    assert peak["peak_flops"] > 1e9
    assert peak["mem_bytes_per_s"] > 1e8
    assert peak["threads"] == 1
    assert peak["method"].startswith("measured")
    assert torch.get_num_threads() == threads_before


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
    def __init__(self):
        self.calls = 0
        self.closed = False
        self.fail_on = set()

    def __call__(self):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("transient")
        return {"gpu_util_pct": self.calls, "mem_used_bytes": 1 << 30, "power_w": 300.0,
                "sm_clock_mhz": 1980, "temperature_c": 50}

    def close(self):
        self.closed = True


def test_sampler_samples_on_schedule_drains_and_stops_promptly():
    reader = _FakeReader()
    reader.fail_on = {2}
    sampler = TelemetrySampler(device_index=3, interval_s=0.02, read=reader).start()
    assert sampler.running
    time.sleep(0.25)
    first = sampler.drain()
    time.sleep(0.1)
    # A long interval must not delay stop(): the thread waits on an Event, not in sleep().
    sampler.interval_s = 60.0
    time.sleep(0.05)
    start = time.perf_counter()
    sampler.stop()
    assert time.perf_counter() - start < 1.0
    assert not sampler.running
    assert reader.closed
    second = sampler.drain()
    assert sampler.drain() == []

    rows = first + second
    assert 3 <= len(first) <= 14  # ~12 slots of 20 ms in 250 ms, one of them a failed read
    assert sampler.errors == 1 and sampler.last_error == "RuntimeError: transient"
    assert [r["gpu_util_pct"] for r in rows] == sorted(r["gpu_util_pct"] for r in rows)  # oldest first, no loss
    assert len(rows) == reader.calls - 1
    assert set(rows[0]) == {"time", "elapsed_s", *FIELDS, "sample_s", "device_index"}
    assert all(r["device_index"] == 3 for r in rows)
    elapsed = [r["elapsed_s"] for r in rows]
    assert elapsed == sorted(elapsed) and elapsed[0] < 0.02
    assert abs(rows[0]["time"] - time.time()) < 5
    # On schedule: call k (1-based) is read in slot k-1 or, after a late read skipped slots,
    # later; never earlier (the second call failed and left no row).
    calls = [1] + list(range(3, len(rows) + 2))
    assert all(r["elapsed_s"] >= (k - 1) * 0.02 - 0.002 for r, k in zip(first, calls))
    assert not any(t.name == "telemetry-gpu3" for t in threading.enumerate())


def test_sampler_rejects_non_positive_interval_and_double_start():
    with pytest.raises(ValueError):
        TelemetrySampler(0, interval_s=0)
    sampler = TelemetrySampler(0, interval_s=10, read=_FakeReader()).start()
    try:
        with pytest.raises(RuntimeError):
            sampler.start()
    finally:
        sampler.stop()
    assert len(sampler.drain()) == 1  # the sample taken at start


def _fake_pynvml(unsupported_power: bool = False):
    """Just enough of nvidia-ml-py for NvmlReader and start_telemetry."""

    class NVMLError(Exception):
        pass

    state = {"inits": 0, "uuid": None}

    def get_power(handle):
        if unsupported_power:
            raise NVMLError("Not Supported")
        return 312_500  # milliwatts

    def init():
        state["inits"] += 1

    def shutdown():
        state["inits"] -= 1

    def by_uuid(uuid):
        state["uuid"] = uuid
        return "handle"

    module = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_LibraryNotFound=type("NVMLError_LibraryNotFound", (NVMLError,), {}),
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "handle",
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=5 << 30, total=80 << 30),
        nvmlDeviceGetPowerUsage=get_power,
        nvmlDeviceGetClockInfo=lambda h, clock: 1980,
        nvmlDeviceGetTemperature=lambda h, sensor: 45,
    )
    return module, state


def test_nvml_reader_maps_fields_and_tolerates_unsupported_ones(monkeypatch):
    fake, state = _fake_pynvml(unsupported_power=True)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    reader = telemetry.NvmlReader(uuid="1234-abcd")
    assert state["uuid"] == "GPU-1234-abcd"
    assert reader() == {"gpu_util_pct": 87, "mem_used_bytes": 5 << 30, "power_w": None,
                        "sm_clock_mhz": 1980, "temperature_c": 45}
    reader.close()
    assert state["inits"] == 0


def test_start_telemetry_with_nvml_present(monkeypatch):
    fake, state = _fake_pynvml()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    monkeypatch.setattr(telemetry, "_nvml_uuid", lambda device: "feed-beef")
    sampler, reason = start_telemetry(torch.device("cuda", 0), 0.01)
    try:
        assert sampler is not None and reason.startswith("GPU telemetry on")
        time.sleep(0.05)
    finally:
        sampler.stop()
    rows = sampler.drain()
    assert rows and rows[0]["power_w"] == 312.5 and rows[0]["device_index"] == 0
    assert state["uuid"] == "GPU-feed-beef"
    assert state["inits"] == 0  # every nvmlInit balanced by an nvmlShutdown
