"""What a run ran on: CPU model and count, GPU name and count (NVML), software versions: for its
summary (finish.py), its workers' description (ray_train.py) and the benchmarks' records."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[str]:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver: a CPU machine
        return []
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        return names
    finally:
        pynvml.nvmlShutdown()


def describe_hardware() -> dict:
    gpus = _gpus()
    return {
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu_name": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
    }


def describe_versions() -> dict:
    import torch

    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:  # read from the installed package's metadata: the instrument never imports Ray
        versions["ray"] = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:  # the plain launcher runs without Ray
        versions["ray"] = None
    return versions
