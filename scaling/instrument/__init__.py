"""The instrument, public: attach it to any PyTorch data-parallel job (scaling/instrument/meter.py).

    from scaling import instrument
    meter = instrument.attach(model, optimizer, run_dir=...)                     # the defaults
    meter = instrument.attach(model, optimizer, run_dir=..., warmup_steps=3)     # one setting
    meter = instrument.attach(model, optimizer, settings=instrument.InstrumentSettings(...))

`attach` and `StepMeter` (and torch with them) load on first use, so that the lab's config tree
(scaling/config.py) holds the settings (settings.py) without importing torch.
"""

from scaling.instrument.parts import Identity, Parts
from scaling.instrument.settings import InstrumentSettings


def __getattr__(name: str):
    if name in ("StepMeter", "attach"):
        from scaling.instrument import meter

        return getattr(meter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Identity", "InstrumentSettings", "Parts", "StepMeter", "attach"]
