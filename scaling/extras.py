"""Which optional extra of the `scaling-lab` distribution brings each optional import (pyproject.toml).

The base install is the torch-free part: the records and their readers, the analysis, the projection
and the report's tables. Everything else is an extra; a command that needs one it lacks ends in one
line naming the install that brings it (`scaling.cli.main`), never an ImportError's traceback.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "scaling-lab"  # the name pip knows it by; the import package is `scaling`

# top-level module -> the extra that installs it
EXTRA_OF_MODULE = {
    "torch": "torch",
    "matplotlib": "plots",
    "pynvml": "nvml",
    "mlperf_logging": "mlperf",
    "ray": "lab",
    "PIL": "lab",
    "psutil": "lab",
    "tomli": "lab",
    "transformers": "hf",
    "accelerate": "hf",
    "lightning": "lightning",
}

# what each extra is for, in the words of a one-line refusal
PURPOSE = {
    "torch": "the instrument (attach) and the models",
    "plots": "the figures",
    "nvml": "GPU telemetry",
    "mlperf": "the MLPerf result log",
    "lab": "the lab's Ray Train runs and sweeps",
    "hf": "the Hugging Face Trainer's callback",
    "lightning": "the Lightning callback",
}


def install_line(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_extra(module: str | None) -> str | None:
    """The extra that brings `module` (a dotted name: its top level decides), or None for a module no
    extra brings (a real bug's ImportError, or one of the job's own modules)."""
    return EXTRA_OF_MODULE.get((module or "").partition(".")[0])


def refusal(what: str, module: str, extra: str | None = None) -> str:
    """One line: `what` needs `module`, the extra that brings it (`extra`, or the module's own), and
    the install line."""
    extra = extra or EXTRA_OF_MODULE[module.partition(".")[0]]
    return f"{what} needs {module.partition('.')[0]} ({PURPOSE[extra]}), not installed here: {install_line(extra)}"


def first_missing(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that cannot be imported here (looked up, not imported), or None."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return module
    return None
