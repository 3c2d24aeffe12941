"""The instrument in a Lightning `Trainer`, added with one line (docs/trainers.md).

    from scaling.integrations.lightning import ScalingCallback

    trainer = L.Trainer(strategy="ddp", callbacks=[ScalingCallback("results/my-job/runs/w2", target_loss=0.5)])
    trainer.fit(model, train_loader, val_loader)   # attach's run directory; rank 0 writes summary.json

What Lightning does, and where the callback marks it (lightning 2.6):
- it attaches at `on_fit_start`, after the strategy wrapped the model: to the DDP model
  (`trainer.strategy.model`, whose forward is the LightningModule's `training_step`), counting
  FLOPs on the LightningModule's own `forward` (`flops_module`; a module whose forward is not
  the model has no MFU, with the reason in the summary);
- FSDP2: `ModelParallelStrategy`, whose `configure_model` the user writes with `fully_shard`
  (Lightning's FSDP2 strategy), calls `training_step` and `validation_step` on the LightningModule
  itself, through no wrapper's forward. The callback makes them the forward of a module of its own
  around the LightningModule (`_StepsAsForward`, as DDP's wrapper is), attaches to that module, and
  the instrument's FSDP2 adapter times every unit's all-gathers and reduce-scatters
  (scaling/instrument/backends/fsdp.py). The same holds for a LightningModule on one device.
  Lightning's `FSDPStrategy` wraps with FSDP1, which the instrument does not time: refused in one
  line;
- a step is an optimizer step, under Lightning's closure: forward and backward run *inside*
  `optimizer.step(closure)`, so the torch optimizer's step hooks fire before the forward and
  would cut the phases wrongly. The instrument watches a stand-in optimizer instead, stepped at
  `on_before_optimizer_step` (after backward, before clipping): `backward_s` ends there and
  `optimizer_s` holds clipping and the update. A batch is requested at `on_train_epoch_start`
  and `on_train_batch_end`; with `accumulate_grad_batches` the micro-batches under `no_sync`
  join the step as with attach;
- validation pauses the training clock (eval-mode forwards, meter.py): Lightning leaves the DDP
  wrapper in eval mode after a validation, so the callback gives it the LightningModule's
  training flag before each training batch; the epoch ends at
  `on_train_epoch_end`, after Lightning's epoch-end validation, with its logged `val_loss`
  (`monitor=`), so `target_loss` gives TTA to a validation loss;
- a comm hook set through `DDPStrategy(ddp_comm_hook=...)` is kept and timed: the callback takes
  it from the strategy before the strategy registers it and registers it after attaching (the
  instrument's rule, backends/ddp.py), where Lightning would (on a GPU; Lightning registers none
  on a CPU, and neither does the callback). A post-localSGD hook (model averaging) is refused;
- no A/B overhead by default: calling `training_step` outside Lightning's loop would log into
  its metrics; pass `forward_backward=` and `calibration_data=` (attach's) to have one.

Under Ray Train (`ray.train.lightning`: RayDDPStrategy, prepare_trainer) and `scaling run`, the
run directory comes from the launcher: pass none.
"""

from __future__ import annotations

import functools

import torch
from lightning.pytorch import Callback
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

from scaling import instrument
from scaling.integrations.loop import Requests


class ScalingCallback(Callback):
    """Measure a Lightning job with the instrument (module docstring).

    `run_dir`, `name`, `target_loss`, `forward_backward`, `calibration_data`, `parts`, `settings`
    and any `InstrumentSettings` field as a keyword are `scaling.instrument.attach`'s; `monitor`
    names the logged validation loss.
    """

    def __init__(
        self,
        run_dir=None,
        *,
        name: str | None = None,
        target_loss: float | None = None,
        monitor: str = "val_loss",
        forward_backward=None,
        calibration_data=None,
        settings: instrument.InstrumentSettings | None = None,
        parts: instrument.Parts | None = None,
        **overrides,
    ):
        self.run_dir, self.name, self.target_loss, self.monitor = run_dir, name, target_loss, monitor
        self.forward_backward, self.calibration_data = forward_backward, calibration_data
        self.settings, self.parts, self.overrides = settings, parts, overrides
        self.meter = None
        self._requests: Requests | None = None
        self._comm_hook: tuple | None = None  # (state, hook, wrapper) taken from the strategy
        # what the instrument sees step: Lightning steps the real optimizer inside its closure (module docstring)
        self._stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
        self._samples = 0
        self._steps: _StepsAsForward | None = None  # where the strategy calls the steps on the module itself

    def setup(self, trainer, pl_module, stage):
        strategy = trainer.strategy
        if isinstance(strategy, FSDPStrategy):
            raise ValueError(
                "scaling ScalingCallback: Lightning's FSDPStrategy wraps with FSDP1, which the instrument "
                "does not time; use ModelParallelStrategy with fully_shard (FSDP2) in configure_model, or DDPStrategy"
            )
        if stage != "fit" or not isinstance(strategy, DDPStrategy) or strategy._ddp_comm_hook is None:
            return
        import torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook as post_local_sgd

        if isinstance(strategy._ddp_comm_state, post_local_sgd.PostLocalSGDState):
            raise ValueError(
                "scaling ScalingCallback: a post-localSGD comm hook averages models outside the "
                "all-reduce, which the instrument cannot time; leave ddp_comm_hook unset to measure"
            )
        # Taken before strategy.setup registers it: registered after attaching, it is kept and timed.
        self._comm_hook = (strategy._ddp_comm_state, strategy._ddp_comm_hook, strategy._ddp_comm_wrapper)
        strategy._ddp_comm_hook = strategy._ddp_comm_wrapper = None

    def on_fit_start(self, trainer, pl_module):
        model = trainer.strategy.model  # DDP(_LightningModuleWrapperBase) under DDP
        if model is pl_module:  # ModelParallelStrategy (FSDP2), one device: the steps called on the module itself
            model = self._steps = _StepsAsForward(pl_module)
        self.meter = instrument.attach(
            model,
            self._stand_in,
            run_dir=self.run_dir,
            name=self.name or type(pl_module).__name__,
            flops_module=pl_module,
            target_loss=self.target_loss,
            forward_backward=self.forward_backward,
            calibration_data=self.calibration_data,
            settings=self.settings,
            parts=self.parts,
            **self.overrides,
        )
        if self._comm_hook is not None:
            state, hook, wrapper = self._comm_hook
            if trainer.strategy.root_device.type == "cuda":  # where Lightning registers one (strategies/ddp.py)
                from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook

                _register_ddp_comm_hook(model=model, ddp_comm_state=state, ddp_comm_hook=hook, ddp_comm_wrapper=wrapper)

    def on_train_epoch_start(self, trainer, pl_module):
        if self._requests is None:  # the training loader exists from here on (not yet at on_fit_start)
            self._requests = Requests(self.meter, _batch_size(trainer))
        self._samples = 0
        _follow_module_mode(trainer.strategy.model, pl_module)
        self._requests.request()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        _follow_module_mode(trainer.strategy.model, pl_module)  # after a validation inside the epoch
        self._samples += _samples(batch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._stand_in.step()  # backward ends, the optimizer phase begins (module docstring)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        last = (
            batch_idx + 1 >= trainer.num_training_batches
            or trainer.should_stop
            or 0 < trainer.max_steps <= trainer.global_step
        )
        if last:
            self._requests.end_training()
        else:
            self._requests.request()

    def on_train_epoch_end(self, trainer, pl_module):
        self._requests.end_training()
        loss = trainer.callback_metrics.get(self.monitor)
        self.meter.end_epoch(
            samples=self._samples * self.meter.world_size, val_loss=float(loss) if loss is not None else float("nan")
        )

    def on_fit_end(self, trainer, pl_module):
        self.meter.finish()
        self._restore_steps()

    def on_exception(self, trainer, pl_module, exception):
        if self.meter is not None and not self.meter._finished:
            self.meter.finish(status="failed", error=f"{type(exception).__name__}: {exception}".splitlines()[0])
        self._restore_steps()

    def _restore_steps(self) -> None:
        if self._steps is not None:
            self._steps.restore()
            self._steps = None


class _StepsAsForward(torch.nn.Module):
    """The LightningModule's `training_step` and `validation_step`, called by the strategy on the module
    itself, made this module's forward, so that the instrument's forward hooks see each step as they see
    DDP's wrapper's forward: the module's mode follows the LightningModule's at each call (a validation
    step is an eval-mode forward, which the meter takes out of training time, and whose all-gathers the
    FSDP2 adapter does not record). The LightningModule is registered inside it: the same parameters."""

    STEPS = ("training_step", "validation_step")

    def __init__(self, pl_module):
        super().__init__()
        self.module = pl_module
        self._step = None
        for name in self.STEPS:
            step = getattr(pl_module, name)

            # a function (not a partial): Lightning's is_overridden reads the step's code
            @functools.wraps(step)
            def through_forward(*args, _step=step, **kwargs):
                return self._call(_step, *args, **kwargs)

            setattr(pl_module, name, through_forward)  # an instance attribute over the class's method

    def _call(self, step, *args, **kwargs):
        self.training = self.module.training
        self._step = step
        return self(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._step(*args, **kwargs)

    def restore(self) -> None:
        """The LightningModule's own steps back (the instance attributes removed)."""
        for name in self.STEPS:
            self.module.__dict__.pop(name, None)


def _follow_module_mode(model, pl_module) -> None:
    """Give the wrappers around the LightningModule (DDP) its training flag, their own flag only.

    Lightning's validation calls `trainer.model.eval()` (the DDP wrapper and all inside it) but
    restores the mode of the LightningModule's modules alone, so after the first validation (the
    sanity check) the wrapper stays in eval mode and the instrument, whose hooks are on it, would
    take every training forward for an evaluation. Not `train()`: that would also put back in
    training mode the submodules a user keeps in eval mode (a frozen BatchNorm)."""
    while model is not pl_module and isinstance(model, torch.nn.Module):
        model.training = pl_module.training
        model = getattr(model, "module", pl_module)


def _samples(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else []
    return next((_samples(value) for value in values if isinstance(value, (torch.Tensor, list, tuple, dict))), 1)


def _batch_size(trainer) -> int:
    """The training loader's batch size (what the meter counts per requested batch; the epoch's total is exact)."""
    loader = trainer.train_dataloader
    return getattr(loader, "batch_size", None) or 1
