"""The devices the lab knows: one table (devices.yaml, each number beside its source), two readers.

    load_devices()["V100 SXM2 16GB"]
        # {"peak_tflops_per_s": {...}, "memory_bandwidth_GBps": 900, "throughput": ...}
    match_device("NVIDIA H100 80GB HBM3")   # "H100 SXM": the entry whose `nvml_name` pattern matches the name

The instrument takes a GPU's datasheet peaks and memory bandwidth by the name NVML reports
(scaling/instrument/flops.py: MFU and the roofline); the projection takes a device's published
one-GPU training throughput and memory bandwidth by its entry name (a cluster's `device`:
scaling/projection/cluster.py, compute.py). Pure Python (PyYAML); validated on first read, a bad
table is a UsageError in one line.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml

from scaling.errors import UsageError
from scaling.schema import PEAK_PRECISIONS, PRECISIONS

DEVICES_FILE = Path(__file__).resolve().with_name("devices.yaml")
ENTRY_KEYS = ("nvml_name", "peak_tflops_per_s", "memory_bandwidth_GBps", "memory_GiB", "throughput", "note")
THROUGHPUT_KEYS = ("samples_per_s", "batch", "source")


def _number(value, name: str, where: str, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value <= 0:
        raise UsageError(
            f"device table {DEVICES_FILE}, {where}: {name} must be a positive "
            f"{'integer' if integer else 'number'}, got {value!r}"
        )


def _keys(mapping, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(mapping, dict):
        raise UsageError(f"device table {DEVICES_FILE}, {where}: expected a mapping, got {mapping!r}")
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise UsageError(
            f"device table {DEVICES_FILE}, {where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(allowed)}"
        )


@lru_cache(maxsize=1)
def load_devices() -> dict:
    """devices.yaml, validated: {device: {memory_bandwidth_GBps, [nvml_name], [peak_tflops_per_s:
    {precision: TFLOP/s or None}], [throughput: {model: {precision: {samples_per_s, batch, source}}}]}}."""
    try:
        data = yaml.safe_load(DEVICES_FILE.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read the device table {DEVICES_FILE}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"device table {DEVICES_FILE}: expected a mapping of devices")
    for device, spec in data.items():
        _keys(spec, ENTRY_KEYS, device)
        _number(spec.get("memory_bandwidth_GBps"), "memory_bandwidth_GBps", device)
        if spec.get("memory_GiB") is not None:
            _number(spec["memory_GiB"], "memory_GiB", device)
        if "nvml_name" in spec:
            re.compile(spec["nvml_name"])
        peaks = spec.get("peak_tflops_per_s") or {}
        _keys(peaks, PEAK_PRECISIONS, f"{device}, peak_tflops_per_s")
        for precision, peak in peaks.items():
            if peak is not None:
                _number(peak, precision, f"{device}, peak_tflops_per_s")
        for model, per_precision in (spec.get("throughput") or {}).items():
            _keys(per_precision, PRECISIONS, f"{device}, {model}")
            for precision, entry in per_precision.items():
                if entry is None:
                    continue
                where = f"{device}, {model}, {precision}"
                _keys(entry, THROUGHPUT_KEYS, where)
                _number(entry.get("samples_per_s"), "samples_per_s", where)
                _number(entry.get("batch"), "batch", where, integer=True)
    return data


def match_device(device_name: str) -> str | None:
    """The entry of devices.yaml whose `nvml_name` matches a device's name (case-insensitive), or None."""
    name = device_name.strip().lower()
    for key, spec in load_devices().items():
        if "nvml_name" in spec and re.search(spec["nvml_name"], name):
            return key
    return None
