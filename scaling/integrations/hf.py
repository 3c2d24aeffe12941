"""The instrument in a Hugging Face `transformers.Trainer`, added with one line (docs/trainers.md).

    from scaling.integrations.hf import ScalingCallback

    trainer = Trainer(model=model, args=args, train_dataset=..., eval_dataset=...,
                      callbacks=[ScalingCallback("results/my-job/runs/w2", target_loss=3.28)])
    trainer.train()          # the run directory holds attach's records; rank 0 writes summary.json

What the Trainer does, and where the callback marks it (transformers 5.24, trainer.py `_run_epoch`):
- it attaches at `on_train_begin`, after Accelerate prepared the model: to the DDP model
  (`trainer.model_wrapped`) and the torch optimizer inside Accelerate's, with the precision of
  Accelerate's `mixed_precision` (`bf16=True`: Accelerate enters autocast inside the model's own
  forward, where the instrument's hook cannot see it; fp8 is refused in one line);
- a step is an optimizer step. The Trainer fetches all the step's micro-batches, all-gathers the
  token count, then runs each micro-batch under `no_sync` but the last; so a batch is requested
  at `on_epoch_begin`, `on_substep_end` (after a micro-batch's backward) and `on_step_end` (after
  `zero_grad`), and the epoch's training ends at its last `on_step_end`: the step's `data_s` is
  the fetching and the token all-gather, `backward_s` ends at the optimizer step (clipping in it);
- the token all-gather (`average_tokens_across_devices`) is a collective of its own, not a
  gradient's: it is timed on the host around Accelerate's `gather` (on a GPU, the time to enqueue
  it) and recorded per step as `token_allgather_s` and `token_allgathers` (a collective kind of its
  own, `StepMeter.record_job_collective`, on every step; the summary's `token_allgather_s` and
  `token_allgather_pct`); it lies in the step's `data_s`, outside the gradients' `allreduce_s`
  and `exposed_comm_s`;
- evaluation pauses the training clock (eval-mode forwards, meter.py); each `eval_loss` is an
  evaluation record (`val_loss`) and the epoch's last one the epoch's, so `target_loss` gives
  TTA to an eval loss. The epoch ends (`end_epoch`) once the Trainer's epoch-end evaluation ran;
- the A/B communication overhead: calibration pairs re-run the epoch's first micro-batches
  through the DDP model (`model(**batch).loss.backward()`), giving back gradients, buffers and
  random state, so the Trainer's losses are unchanged (`ab_calibration=False` turns it off).

Under Ray Train (`ray.train.huggingface.transformers.prepare_trainer`) and `scaling run`, the run
directory comes from the launcher: pass none.
"""

from __future__ import annotations

import sys
import time

from transformers import Trainer, TrainerCallback

from scaling import instrument
from scaling.integrations.loop import Requests


def _trainer_calling() -> Trainer:
    """The Trainer whose loop is calling this callback (callbacks are handed its model, not the Trainer)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    raise RuntimeError(
        "scaling ScalingCallback: no transformers.Trainer is calling it; add it with "
        "Trainer(..., callbacks=[ScalingCallback(...)])"
    )


def _accelerate_precision(accelerator) -> str | None:
    """The compute precision Accelerate trains in, which the instrument cannot see for itself.

    With `mixed_precision` (the Trainer's `bf16=True` / `fp16=True`), Accelerate's `prepare` wraps
    the model's own `forward` in autocast, entered after the instrument's forward pre-hook on the
    DDP model has looked, so the meter would take the parameters' fp32 (and MFU an fp32 peak).
    None: no mixed precision, the meter's own reading (autocast at the call, else the parameters').
    """
    mode = str(getattr(accelerator, "mixed_precision", "no") or "no")
    if mode == "no" or not getattr(accelerator, "native_amp", False):
        return None
    if mode in ("bf16", "fp16"):
        return mode
    raise ValueError(
        f"scaling ScalingCallback: Accelerate's mixed_precision={mode!r} has no peak or FLOPs "
        "convention in the instrument; measure with bf16, fp16 or none"
    )


def _batch_samples(inputs) -> int:
    ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
    if ids is None:
        ids = next(
            (value for value in (inputs.values() if hasattr(inputs, "values") else inputs) if hasattr(value, "shape")),
            None,
        )
    return int(ids.shape[0]) if ids is not None and ids.dim() else 1


class ScalingCallback(TrainerCallback):
    """Measure a `transformers.Trainer` job with the instrument (module docstring).

    `run_dir`, `name`, `target_loss`, `parts`, `settings` and any `InstrumentSettings` field
    as a keyword are `scaling.instrument.attach`'s.
    """

    def __init__(
        self,
        run_dir=None,
        *,
        name: str | None = None,
        target_loss: float | None = None,
        ab_calibration: bool = True,
        settings: instrument.InstrumentSettings | None = None,
        parts: instrument.Parts | None = None,
        **overrides,
    ):
        self.run_dir, self.name, self.target_loss = run_dir, name, target_loss
        self.ab_calibration, self.settings, self.parts, self.overrides = ab_calibration, settings, parts, overrides
        self.meter = None
        self._trainer = None
        self._requests: Requests | None = None
        self._calibration_batches: list = []
        self._epoch_open = False  # an epoch whose end_epoch has not run
        self._val_loss = float("nan")
        self._samples = 0  # micro-batch samples this rank trained this epoch
        self._counting_tokens = False

    # --- what the callback wraps on the Trainer (instance attributes, removed at the end) ----------

    def _wrap_trainer(self, trainer: Trainer, keep: int) -> None:
        training_step, fetch_batches = trainer.training_step, trainer.get_batch_samples
        gather = trainer.accelerator.gather

        def counted_training_step(model, inputs, *args, **kwargs):
            # the samples actually trained (the meter counts the per-device batch size at the request)
            self._samples += _batch_samples(inputs)
            if len(self._calibration_batches) < keep:  # the A/B window's batches: the first few of the run
                self._calibration_batches.append(inputs)
            return training_step(model, inputs, *args, **kwargs)

        def fetching(*args, **kwargs):
            # the training loop's fetch of a step's micro-batches, where it counts their tokens (an evaluation's
            # prediction_step counts too, not through here); not the model's mode, which an epoch's first fetch
            # finds in eval after the previous epoch's evaluation
            self._counting_tokens = True
            try:
                return fetch_batches(*args, **kwargs)
            finally:
                self._counting_tokens = False

        def timed_gather(tensor):
            if not self._counting_tokens:
                return gather(tensor)
            start = time.perf_counter()
            try:
                return gather(tensor)
            finally:
                self.meter.record_job_collective("token_allgather", time.perf_counter() - start)

        trainer.training_step, trainer.get_batch_samples = counted_training_step, fetching
        trainer.accelerator.gather = timed_gather

    def _unwrap_trainer(self) -> None:
        for owner, name in (
            (self._trainer, "training_step"),
            (self._trainer, "get_batch_samples"),
            (self._trainer.accelerator, "gather"),
        ):
            owner.__dict__.pop(name, None)

    # --- the Trainer's events -------------------------------------------------------------------

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        trainer = self._trainer = _trainer_calling()
        wrapped = trainer.model_wrapped  # DDP(model) from Accelerate; the model itself on one process

        def forward_backward(batch):
            output = wrapped(**batch)
            (output["loss"] if isinstance(output, dict) else output.loss).backward()

        self.meter = instrument.attach(
            wrapped,
            getattr(optimizer, "optimizer", optimizer),  # the torch optimizer inside Accelerate's
            run_dir=self.run_dir,
            name=self.name,
            target_loss=self.target_loss,
            settings=self.settings,
            parts=self.parts,
            precision=_accelerate_precision(trainer.accelerator),
            forward_backward=forward_backward if self.ab_calibration else None,
            calibration_data=(lambda epoch: self._calibration_batches) if self.ab_calibration else None,
            **self.overrides,
        )
        self._wrap_trainer(trainer, self.meter.settings.calibration_pairs if self.ab_calibration else 0)
        self._requests = Requests(self.meter, args.per_device_train_batch_size)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._end_epoch()
        self._epoch_open, self._val_loss, self._samples = True, float("nan"), 0
        self._requests.request()

    def on_substep_end(self, args, state, control, **kwargs):
        self._requests.request()

    def on_step_end(self, args, state, control, **kwargs):
        # the epoch's last optimizer step: state.epoch reaches the next whole epoch exactly (trainer.py)
        last = state.epoch == int(state.epoch) or control.should_epoch_stop or control.should_training_stop
        if last:
            self._requests.end_training()
        else:
            self._requests.request()

    def on_epoch_end(self, args, state, control, **kwargs):
        self._requests.end_training()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = float((metrics or {}).get("eval_loss", float("nan")))
        if self._requests is not None and self._requests.training:  # inside the epoch: an evaluation of its own
            self.meter.record_eval(None, epoch_progress=float(state.epoch), val_loss=loss)
        elif self._epoch_open:  # after the epoch's training: the epoch's evaluation
            self._val_loss = loss

    def on_train_end(self, args, state, control, **kwargs):
        if self.meter is None:
            return
        self._end_epoch()
        self._unwrap_trainer()
        self.meter.finish()

    def _end_epoch(self) -> None:
        """The epoch's row, once its evaluation ran (at the next epoch's start, or the training's end)."""
        if not self._epoch_open:
            return
        self._epoch_open = False
        self._requests.end_training()
        config = getattr(self._trainer.model, "config", None)
        use_cache = getattr(config, "use_cache", None)
        if use_cache is False:
            # The Trainer trains with use_cache=False, and such a model, called without a mask, looks for packed
            # sequences in its position ids (an .item()): the FLOPs count on the meta device (first end_epoch)
            # cannot run that. With a cache it does not look; a cache changes no loss or gradient.
            config.use_cache = True
        try:
            self.meter.end_epoch(
                samples=self._samples * self.meter.world_size,
                val_loss=self._val_loss,
            )
        finally:
            if use_cache is False:
                config.use_cache = False
