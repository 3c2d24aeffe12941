"""Trainers' callbacks: the instrument for jobs whose loop a trainer owns (docs/trainers.md).

    from scaling.integrations.hf import ScalingCallback          # transformers.Trainer(callbacks=[...])
    from scaling.integrations.lightning import ScalingCallback   # lightning.Trainer(callbacks=[...])

Each is a client of `scaling.instrument.attach` like the lab's own loop: it attaches to the model
and optimizer the trainer prepared and marks the requests for batches that a hand-written loop
marks with `meter.batches` (loop.py, through the meter's push API), so the run directory and its
figures are attach's. Each module imports its trainer's package, an optional extra
(`pip install 'scaling-lab[hf]'`, `'scaling-lab[lightning]'`); this package imports neither.
`scaling attach -- CMD` adds them to an unchanged job (auto.py). Accelerate used directly needs no
callback: `attach` the model and optimizer `accelerator.prepare` returned
(examples/trainers/accelerate_job.py).
"""
