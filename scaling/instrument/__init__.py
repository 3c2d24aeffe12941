"""The instrument, public: attach it to any PyTorch data-parallel job (scaling/instrument/meter.py).

    from scaling import instrument
    meter = instrument.attach(model, optimizer, run_dir=...)
"""

from scaling.instrument.meter import StepMeter, attach

__all__ = ["StepMeter", "attach"]
