"""The scaling lab: data-parallel PyTorch training on Ray, timed step by step.

Layout (data flows one way): config -> launch -> per-worker loop (instrumented) -> records
on disk -> analysis -> figures and reports. See docs/ and the README.
"""

__version__ = "0.1.0"
