"""The instrument for any PyTorch data-parallel training job: `attach` it, train as usual.

    from scaling import instrument

    with instrument.attach(model, optimizer, run_dir="results/my-job/runs/w2",
                           forward_backward=lambda batch: loss_fn(model(batch[0]), batch[1]).backward(),
                           calibration_data=train_loader) as meter:
        for epoch in range(epochs):
            for inputs, labels in meter.batches(train_loader):   # the one line in the loop
                loss = loss_fn(model(inputs), labels)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            meter.end_epoch(val_accuracy=evaluate(model))
    # leaving the block finishes the run (or `meter.finish()` without `with`)

`model` is the DDP model (as `ray.train.torch.prepare_model` returns it; at world size 1 the
plain module), or a model whose modules were sharded with FSDP2's `fully_shard`, `optimizer`
the torch optimizer or Horovod's `DistributedOptimizer` (a list of them where a batch steps
several, as a GAN does). Attach before registering a DDP comm hook of your own: yours is then
kept and timed (DDP allows one hook per model and cannot replace it later); with FSDP2, after
setting its communication (`set_custom_all_gather` and the like), which is then timed.

How a step is cut into phases, without per-phase code (marks on `Clock`: the host clock on CPU,
CUDA events on GPU, resolved once per epoch):
- **a step is an optimizer step**. It runs from a request for a batch (`meter.batches`) to the
  request after the batch whose optimizer step ran, so the steps of an epoch tile its training
  time. With gradient accumulation a step holds several micro-batches; each is recorded
  (`micro_batches`, and `synced_micro_batches`: those whose backward communicated). The rule
  that closes a step at the next request, in order:
    1. a batch the loop ran no training forward on (skipped) joins the next step;
    2. a batch whose optimizer step ran closes the step (`optimizer_steps` counts the calls:
       two optimizers, or one stepped twice, make one step);
    3. a batch after which the gradients were cleared (`zero_grad()`, which sets them to None)
       though no optimizer step ran closes it: the step GradScaler skipped on inf/NaN
       (`optimizer_steps` 0);
    4. any other batch is a micro-batch of the step: accumulation goes on, whether its backward
       synchronised gradients (DDP's `no_sync` left out) or not. A skipped step whose gradients
       are zeroed in place (`zero_grad(set_to_none=False)`) cannot be told from accumulation
       and joins the next step.
  The last step of an epoch ends when the loader is exhausted, or at its optimizer step's end
  when the loop left `batches` early;
- per micro-batch, `data_s`: from the request until the model's first training forward starts
  (module forward pre-hook): the loader's wait, plus any host-to-device copy done before
  forward; `forward_s`: from there to the end of the micro-batch's last training forward before
  its optimizer step (a model called twice, as in a siamese loss, is one forward phase);
  `backward_s`: from the end of forward to the next request or the optimizer step's start
  (optimizer step pre-hook): the loss, backward and whatever the loop does before stepping
  (gradient clipping, GradScaler's unscale). With DDP the all-reduces finish inside backward;
  with Horovod the instrument waits for them here, timed (backends/horovod.py), so both expose
  the same way; `optimizer_s`: from the first optimizer step's start to the next request
  (zero_grad and an LR scheduler's step included). The step's phases are their sums;
- **evaluation inside an epoch is not training**: a forward of the model in eval mode or with
  gradients off (`model.eval()`, `torch.no_grad()`, `torch.inference_mode()`) pauses the
  training clock automatically, from that forward's start to the loop's next training event (a
  training forward, an optimizer step, the next batch request, the epoch's end). The pause is
  taken out of the step's phases and of `train_s` and counted in the epoch's `eval_s`, as
  `meter.paused()` does explicitly (which also covers work before the first eval forward);
- communication per collective from the backend's timer (`allreduce_s`, `exposed_comm_s`:
  timing.py; FSDP2's all-gathers and reduce-scatters: backends/fsdp.py), summed over the step's
  micro-batches;
- peak memory per rank and epoch (`peak_memory_bytes`: memory.py), over the epoch's training.

A/B communication overhead: with `forward_backward` (a function that runs forward, loss and
backward on one batch) and `calibration_data` (an iterable of batches, or a function of the
epoch returning one), `end_epoch` runs `calibration_pairs` pairs of that function with gradient
synchronisation off and on, alternating, on the same batch: one micro-batch each, so the A/B
difference is the cost of synchronising one micro-batch, and the summary scales it by the
synchronised micro-batches per step (scaling/analysis/run_metrics.py defines the figure).
Without them the A/B figure is absent from the summary, with the reason; never a zero made up.
**The calibration changes nothing in the training**: the job's gradients are set aside and put
back, the module buffers (BatchNorm statistics) restored, and the random number generators
(torch's CPU and CUDA, Python's, NumPy's) restored, so the dropout masks and the loader's
shuffling that follow are those of the job without the instrument (tests/test_real_jobs.py).

A run that fails is still recorded: `with instrument.attach(...) as meter:` detaches the hooks
on the way out and finishes the run, with `status: failed` and the error when the block raised.

Records: the same run directory as the lab's own runs (scaling/results.py, docs/results.md):
per-step rows, per-epoch rows, the compute profile, attempts; `finish()` of a job on its own
hands the run to its finisher, which writes `summary.json` (under `scaling run` the lab's
launcher writes it from the config).

Settings (scaling/instrument/settings.py): `settings=` and keyword overrides, else those of the
run a launcher handed this process (`LaunchedRun`: `scaling run` driving a user's function),
else the defaults. Identity, live metrics and the finisher come from whoever runs the job
(`parts=`), else from the installed providers (scaling/instrument/parts.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaling import noise_scale, writer_lock
from scaling.instrument.backends import detect
from scaling.instrument.calibration import CalibrationWindow, rng_untouched
from scaling.instrument.inputs import batch_samples, model_input
from scaling.instrument.memory import PeakMemory
from scaling.instrument.parts import Parts, identity_from_environment, installed_parts
from scaling.instrument.recorder import RunRecorder
from scaling.schema import PRECISIONS, ddp_settings_with_work
from scaling.instrument.settings import FIRST_TIMED_STEPS, InstrumentSettings, LaunchedRun
from scaling.instrument.thread_usage import ThreadUsage
from scaling.instrument.timing import StepMarks, clock_for
from scaling.results import COMPUTE_PROFILE_JSON, JOB_JSON


class _OpenStep:
    """The marks of the step in progress (StepMarks once closed) and of its batch in progress."""

    __slots__ = (
        "start",
        "index",
        "samples",
        "segments",
        "micro_buckets",
        "pauses",
        "optimizer_steps",
        "optimizer_end",
        "phase",
        "forwarded",
        "stepped",
        "comm_timed",
        "job_collectives",
        "planted_s",
        "wrapper",
        "inner_end",
    )

    def __init__(self, start, index: int, samples: int, comm_timed: bool):
        self.start, self.index, self.samples, self.comm_timed = start, index, samples, comm_timed
        self.segments: list = []  # [(phase, end mark)]
        self.micro_buckets: list = []
        self.pauses: list = []
        self.optimizer_steps = 0
        self.optimizer_end = None
        self.planted_s = 0.0  # the ground-truth delays slept in this step on this rank (StepMarks.planted_s)
        # the batch in progress: the phase it is in, whether it ran a training forward and an optimizer step
        self.phase, self.forwarded, self.stepped = "data", False, False
        self.job_collectives: dict | None = None  # kind -> [seconds, count]: record_job_collective
        # DDP's own work around the module's forward (StepMarks.wrapper), and where the module's forward ended
        self.wrapper: list = []
        self.inner_end = None

    def boundary(self, phase: str, mark) -> None:
        self.segments.append((phase, mark))


@dataclass(frozen=True)
class Job:
    """What a job tells the instrument of itself beyond its model and optimizer, each field an `attach`
    keyword of the same name. `attach` makes one; the meter reads it."""

    run_dir: str | Path | None = None
    """Where the records go: None under `scaling run`, which hands it over; None on its own keeps them
    in memory only."""
    forward_module: torch.nn.Module | None = None
    """The module the loop calls for forward, when it is not `model` (a `torch.compile`d wrapper: hooks
    on the module inside a compiled graph would be traced)."""
    flops_module: torch.nn.Module | None = None
    """The module whose forward the FLOPs are counted on, when the wrapped module runs more than the
    model (Lightning's DDP forward is `training_step`: scaling/integrations/)."""
    forward_backward: Callable | None = None
    """`forward_backward(batch)`, with `calibration_data`: for the A/B communication overhead."""
    calibration_data: Any = None
    """The batches the A/B calibration window steps on (see `forward_backward`)."""
    name: str | None = None
    """What the summary calls the job (default: the model's class name)."""
    target_accuracy: float | None = None
    """The validation accuracy whose first epoch at or above it is the time-to-accuracy."""
    target_loss: float | None = None
    """Instead of `target_accuracy`: a validation loss, reached at or below it (a language model's: pass
    `meter.end_epoch(val_loss=...)`; TTA as modded-nanogpt's speedrun measures it)."""
    precision: str | None = None
    """"fp32", "bf16" or "fp16": the compute precision, for a model that enters autocast inside its own
    forward, after the instrument's forward pre-hook has looked (what Accelerate's `prepare` does with
    `mixed_precision`: scaling/integrations/hf.py passes it). None: autocast's at the forward's call,
    else the parameters' dtype."""

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(
                f"attach: precision={self.precision!r}; valid: {', '.join(map(repr, PRECISIONS))} "
                "or None (the forward's)"
            )


class StepMeter:
    """Per-step, per-rank timing of a training job; see the module docstring. Create with `attach`."""

    def __init__(self, model, optimizer, job: Job, *, settings: InstrumentSettings, parts: Parts):
        self.settings = settings
        forward_module = job.forward_module
        # the compute precision its caller knows (autocast entered inside the model's forward: attach's docstring)
        self._declared_precision = job.precision
        self.run_dir = Path(job.run_dir).resolve() if job.run_dir is not None else None
        # two optimizers stepped per batch (a GAN) may come as a list: all are watched, the first is the job's
        optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        self.model, self.optimizer = model, optimizers[0]
        self.backend = detect(model, optimizers[0])
        # the module whose forward is the model's, for the FLOPs count and the job's description
        self.flops_module = job.flops_module if job.flops_module is not None else self.backend.plain_model
        self.forward_backward, self.calibration_data = job.forward_backward, job.calibration_data
        self.name = job.name or type(self.flops_module).__name__
        self.target_accuracy = job.target_accuracy
        # a lower-is-better target on the `val_loss` column, instead of the accuracy's
        self.target_loss = job.target_loss
        self.finisher = parts.finisher
        identity = parts.identity or identity_from_environment()
        self.rank, self.world_size = identity.rank, identity.world_size
        self.local_rank, self.node_rank = identity.local_rank, identity.node_rank
        # One writer per run directory (scaling/writer_lock.py): a job on its own holds it from rank 0;
        # under a launcher (scaling run, sweep, attach) the launcher's driver holds it already.
        self._writer_lock = None
        if (
            self.rank == 0
            and self.run_dir is not None
            and LaunchedRun.from_environment() is None
            and not writer_lock.held_here(self.run_dir)
        ):
            self._writer_lock = writer_lock.WriterLock(self.run_dir, "scaling.instrument.attach")
            self._writer_lock.acquire()
        parameter = next(model.parameters(), None)
        self.device = parameter.device if parameter is not None else torch.device("cpu")
        self.clock = clock_for(self.device)
        # Cross-rank attribution and clock alignment go over a CPU group (gloo): the job's own may be NCCL.
        self.sync_group = None
        self.clock_offset_s, self.clock_uncertainty_s = 0.0, 0.0
        if self.world_size > 1 and settings.step_timing:
            from scaling.instrument.clock_sync import estimate_offsets

            self.sync_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
            self.clock_offset_s, self.clock_uncertainty_s = estimate_offsets(self.sync_group)
        warmup, traced = settings.warmup_steps, settings.trace_steps
        self.recorder = RunRecorder(
            self.clock,
            self.rank,
            self.node_rank,
            self.local_rank,
            self.run_dir,
            group=self.sync_group,
            world_size=self.world_size,
            offset_s=self.clock_offset_s,
            trace_steps=range(warmup, warmup + traced),
        )
        self.recorder.write_rank_json(
            "clock", {"offset_s": self.clock_offset_s, "uncertainty_s": self.clock_uncertainty_s}
        )
        # the framework's own communication timers, a second opinion on the comm figures
        self.second_opinion = self.backend.second_opinion(warmup) if settings.step_timing else None
        self._straggle_s = (
            settings.inject_straggler_s if self.rank == settings.straggler_rank and self.world_size > 1 else 0.0
        )
        self.live = parts.live_metrics(self.name, identity) if parts.live_metrics is not None else None
        self.timing = bool(settings.step_timing)
        # the instrument's own Python per step, summed by its hooks (`instrument_host_s` in the step records)
        self._host_s = 0.0
        # The lab's own 1-worker runs train the plain module: nothing to time.
        communicates = self.world_size > 1 or self.backend.communicates_alone
        if settings.inject_comm_delay_s and settings.inject_comm_delay_into not in self.backend.injectable:
            raise ValueError(
                f"inject_comm_delay_into={settings.inject_comm_delay_into!r} is not offered by "
                f"{self.backend.wraps} (it offers {', '.join(self.backend.injectable)})"
            )
        self._pace_s = settings.pace_idle_s
        if self._pace_s and (self.world_size > 1 or not self.timing):
            raise ValueError(
                "pace_idle_s is for a 1-worker run with step timing (a projection's baseline): at more workers "
                "the collectives themselves wait"
            )
        paces_itself = bool(self._pace_s) and self.backend.paces_collectives
        # the noise scale's two batch sizes, a rank's and the global one, from the timed all-reduces' norms
        self._norms_on = bool(self.timing and communicates and self.world_size > 1)
        if self.timing and (communicates or paces_itself):
            self.backend.install_timer(self.clock, settings.inject_comm_delay_s, settings.inject_comm_delay_into)
            if paces_itself:
                self.backend.set_pace(self._pace)
            self.backend.measure_norms(self._norms_on)
        elif settings.inject_comm_delay_s:
            raise ValueError(
                "inject_comm_delay_s needs step timing and communication (a DDP model, or more than one worker)"
            )
        self._noise_steps: list[StepMarks] = []  # this epoch's steady steps with the noise scale's norms
        self._noise_window: list[tuple] = []  # 1 worker: the calibration window's (|G_small|², |G_big|², B, 2B)
        self._handles = []
        # the push API's state (request_batch, batch_arrived): an epoch's training in progress, its last
        # request's mark, and whether the batch asked for continues the step in progress
        self._feeding, self._request, self._continues = False, None, False
        self._install_hooks(model, forward_module, optimizers)
        self.attached_unix = time.time()
        self._started_at = dt.datetime.now(dt.timezone.utc)
        self.global_step = 0  # training steps so far, over the run (continues after a restart)
        self.epoch = 0  # epochs finished
        self.elapsed_train_s = 0.0
        self.run_first_step_unix: float | None = None
        self._resumed_from: dict | None = None
        self._step: _OpenStep | None = None  # marks of the step in progress
        self._calib: dict | None = None  # marks of the calibration half in progress
        self.calibration = CalibrationWindow(self)  # the A/B window at each epoch's end (calibration.py)
        self._epoch_steps = 0
        self._epoch_samples = 0
        self._training_end: float | None = None
        self._train_started: float | None = None
        self._thread_usage: ThreadUsage | None = None
        self._input_shape: tuple | None = None
        self._input_dtype: torch.dtype | None = None  # integer: token ids (the FLOPs counter feeds ids, not floats)
        self._input_keyword: str | None = None  # the keyword the input came by (input_ids=), None: positional
        self._input_problem: str | None = None  # why the first training forward's input was not understood
        self._real_tokens_per_sample: float | None = None  # the first batch's attention_mask, per sample
        self._input_observed = False  # the first training forward is looked at once, never again
        self._num_outputs: int | None = None
        self._precision: str | None = None  # the first training forward's (None: none seen)
        self._per_rank_batch: int | None = None
        self._calibrating = False
        self._paused_s = 0.0  # training time of this epoch spent paused (evaluations inside it)
        self._pause_started: float | None = None
        self._pause: dict | None = None  # the pause in progress (an evaluation inside the epoch)
        self._paused_usage: list[dict] = []
        self._finished = False
        self._evals: list[dict] = []  # this epoch's evaluations, written at end_epoch
        self._step_depth = 0  # nesting of optimizer step() calls (see _on_step_start)
        self._peak_memory = PeakMemory(self.device)
        self._epoch_peak_memory: tuple[float, str] = (float("nan"), "")
        self._memory_epochs: list[dict] = []  # this rank's peak per epoch (workers/rank<R>-memory.json)
        self._telemetry, self.telemetry_note = None, "GPU telemetry off"
        if settings.telemetry_interval_s > 0:
            from scaling.instrument.telemetry import start_telemetry

            self._telemetry, self.telemetry_note = start_telemetry(self.device, settings.telemetry_interval_s)

    # --- hooks ----------------------------------------------------------------------------

    def _install_hooks(self, model, forward_module, optimizers: list) -> None:
        """The forward hooks on the module whose forward is the model's (or, with step timing off, two that
        look at the first training forward once and let go) and the optimizers' step hooks."""
        watched = forward_module if forward_module is not None else model
        if self.timing:
            # first among the pre-hooks: FSDP's own (its root's all-gather) belongs to forward
            # with_kwargs: a model called with keywords (a Hugging Face model's input_ids=) shows its input
            self._handles += [
                watched.register_forward_pre_hook(self._on_forward_start, prepend=True, with_kwargs=True),
                watched.register_forward_hook(self._on_forward_end),
            ]
            inner = self.backend.plain_model
            if forward_module is None and inner is not model:  # an evaluation on the module inside the wrapper
                self._handles.append(inner.register_forward_pre_hook(self._on_eval_forward_start))
                if ddp_settings_with_work(self.backend.per_step_settings()):
                    # DDP's own work before and after the module's forward, timed where a setting makes it
                    # (`wrapper_s`): two marks per step, and no hook at all for a wrapper without such work
                    self._handles += [
                        inner.register_forward_pre_hook(self._on_inner_forward_start),
                        inner.register_forward_hook(self._on_inner_forward_end),
                    ]
        else:  # epoch timing only: look at the first training forward (for the FLOPs profile), then let go

            def once_before(module, args, kwargs):
                if self._train_started is not None:
                    self._observe_input(args, kwargs)
                    before.remove()

            def once_after(module, args, output):
                if self._train_started is not None and self._input_observed:  # understood or not: once
                    self._observe_output(output)
                    after.remove()

            before = watched.register_forward_pre_hook(once_before, with_kwargs=True)
            after = watched.register_forward_hook(once_after)
            self._handles += [before, after]
        if self.timing or self.backend.waits_at_step:
            for each in optimizers:
                self._handles += [
                    each.register_step_pre_hook(self._on_step_start),
                    each.register_step_post_hook(self._on_step_end),
                ]

    def _training_forward(self, module) -> bool:
        return module.training and torch.is_grad_enabled()

    def _on_forward_start(self, module, args, kwargs=None):
        entered = time.perf_counter()
        try:
            if self.second_opinion is not None:
                # the training step this forward belongs to (its record's epoch and step), None for an A/B half's
                key = None if self._calibrating or self._step is None else (self.epoch + 1, self._step.index)
                self.second_opinion.before_forward(key)
            if self._calibrating:
                if self._calib is not None and "forward_start" not in self._calib:
                    self._calib["forward_start"] = self.clock.mark()
                return
            step = self._step
            if step is None:
                return
            if not self._training_forward(module):
                self._pause_for_evaluation()
                return
            self._end_evaluation()
            if step.phase == "data":
                step.boundary("data", self.clock.mark())
                step.phase, step.forwarded = "forward", True
                if not self._input_observed:
                    self._observe_input(args, kwargs)
            elif step.phase == "backward" and not step.stepped:  # a second forward before backward (siamese)
                step.boundary("forward", self.clock.mark())
                step.phase = "forward"
        finally:
            self._host_s += time.perf_counter() - entered

    def _on_eval_forward_start(self, module, args, kwargs=None):
        """The user's module inside the wrapper: seen only to notice an evaluation that bypasses the wrapper."""
        if not self._calibrating and self._step is not None and not self._training_forward(module):
            self._pause_for_evaluation()

    def _on_inner_forward_start(self, module, args):
        """The module inside DDP's wrapper starts a training forward: the wrapper's own work before it (its
        buffers' broadcast) has ended since the forward began."""
        entered = time.perf_counter()
        step = self._step
        if not self._calibrating and step is not None and step.phase == "forward" and self._training_forward(module):
            step.wrapper.append((step.segments[-1][1], self.clock.mark()))
        self._host_s += time.perf_counter() - entered

    def _on_inner_forward_end(self, module, args, output):
        """The module inside DDP's wrapper ends its training forward: the wrapper's own work after it (the
        search for unused parameters) runs until the forward ends (`_on_forward_end`)."""
        entered = time.perf_counter()
        step = self._step
        if not self._calibrating and step is not None and step.phase == "forward" and self._training_forward(module):
            step.inner_end = self.clock.mark()
        self._host_s += time.perf_counter() - entered

    def _on_forward_end(self, module, args, output):
        entered = time.perf_counter()
        try:
            if self._calibrating:
                if self._calib is not None and "forward_end" not in self._calib:
                    self._calib["forward_end"] = self.clock.mark()
                return
            step = self._step
            if step is None or step.phase != "forward" or self._pause is not None:
                return
            ended = self.clock.mark()
            step.boundary("forward", ended)
            if step.inner_end is not None:
                step.wrapper.append((step.inner_end, ended))
                step.inner_end = None
            step.phase = "backward"
            self._observe_output(output)
            if self._straggle_s:
                began = time.perf_counter()
                time.sleep(self._straggle_s)  # ground truth: this rank's backward starts late (a straggler)
                slept = time.perf_counter() - began
                entered += slept  # the job's injected time, not the instrument's
                step.planted_s += slept
            if self.second_opinion is not None:
                self.second_opinion.after_forward()
        finally:
            self._host_s += time.perf_counter() - entered

    def _observe_input(self, args, kwargs=None) -> None:
        """The first training forward, once: its input's shape and dtype and the keyword it came by
        (`inputs.model_input`), the real tokens per sample where an `attention_mask` came with token ids,
        and the compute precision (attach's `precision`, else `_precision_seen`), for the FLOPs
        profile. An input not understood leaves its reason."""
        if self._input_observed:
            return
        self._input_observed = True
        self._precision = self._declared_precision or _precision_seen(self.device, self.backend)
        first, keyword, problem = model_input(args, kwargs)
        if first is None:
            self._input_problem = problem
            return
        self._input_shape, self._input_dtype, self._input_keyword = tuple(first.shape), first.dtype, keyword
        mask = (kwargs or {}).get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.shape == first.shape and first.dim() == 2 and first.shape[0]:
            # once per run: the item() waits for the device (the first batch's only)
            self._real_tokens_per_sample = (mask != 0).sum().item() / first.shape[0]

    def _observe_output(self, output) -> None:
        if self._num_outputs is None:
            from scaling.instrument.flops import output_logits

            logits = output_logits(output)
            if logits is not None and logits.dim() >= 1:
                self._num_outputs = int(logits.shape[-1])

    def _on_step_start(self, optimizer, args, kwargs):
        # An optimizer subclass whose step() calls its parent's (Horovod's DistributedOptimizer)
        # runs the hooks once per class: act on the outermost call only.
        entered = time.perf_counter()
        try:
            self._step_depth += 1
            if self._calibrating or self._step_depth > 1:
                return
            waited = time.perf_counter()
            self.backend.wait_after_backward()
            if self._pace_s and not self.backend.paces_collectives:
                self._pace()  # where the gradients' all-reduce would be waited for
            entered += time.perf_counter() - waited  # communication's (or its stand-in's) time, not the instrument's
            step = self._step
            if step is not None:
                self._end_evaluation()
                if step.phase != "optimizer":  # the first optimizer of the batch: backward ends here
                    step.boundary(step.phase, self.clock.mark())
                    step.phase = "optimizer"
        finally:
            self._host_s += time.perf_counter() - entered

    def _pace(self) -> None:
        """A paced 1-worker run (`pace_idle_s`): idle where a collective would be waited for, inside a
        training step only, the idle a pause of the step (out of its phases, in `paused_s`)."""
        step = self._step
        if step is None or self._calibrating or self._pause is not None or step.phase == "optimizer":
            return
        start = self.clock.mark()
        time.sleep(self._pace_s)
        step.pauses.append((start, self.clock.mark()))

    def _on_step_end(self, optimizer, args, kwargs):
        entered = time.perf_counter()
        try:
            self._step_depth -= 1
            if self._calibrating or self._step_depth > 0:
                return
            self.backend.after_step()
            step = self._step
            if step is not None:
                step.stepped = True
                step.optimizer_steps += 1
                step.optimizer_end = self.clock.mark()

        # --- evaluations inside an epoch -------------------------------------------------------
        finally:
            self._host_s += time.perf_counter() - entered

    def _pause_for_evaluation(self) -> None:
        """An evaluation forward inside training: stop the training clock until the next training event."""
        if self._pause is None and self._training_end is None and self._train_started is not None:
            self._begin_pause(automatic=True)

    def _end_evaluation(self, mark=None) -> None:
        """An automatic pause ends (at `mark`, the training event's own mark, else now)."""
        if self._pause is not None and self._pause["automatic"]:
            self._end_pause(mark)

    def _begin_pause(self, automatic: bool) -> None:
        self._pause = {
            "automatic": automatic,
            "host": time.perf_counter(),
            "mark": self.clock.mark(),
            "usage": ThreadUsage(),
        }
        self._pause_started = self._pause["host"]

    def _end_pause(self, mark=None) -> None:
        pause, self._pause = self._pause, None
        self._pause_started = None
        self._paused_s += time.perf_counter() - pause["host"]
        self._paused_usage.append(pause["usage"].stop())
        if self._step is not None:
            self._step.pauses.append((pause["mark"], mark if mark is not None else self.clock.mark()))

    # --- the training loop's one line, and the push API beneath it ----------------------------

    def batches(self, iterable):
        """Yield the batches of `iterable` (one epoch), timing every step (module docstring). The same as
        `request_batch()` before each of the iterable's batches, `batch_arrived(batch)` after it, and
        `end_batches()` when it runs dry."""
        iterator = iter(iterable)
        try:
            while True:
                self.request_batch()
                try:
                    batch = next(iterator)
                except StopIteration:
                    self._batches_ran_dry()
                    return
                self.batch_arrived(batch)
                yield batch
        finally:
            if self._feeding:  # the loop left the epoch's batches early (a break, an exception)
                self._feeding = False
                self._end_evaluation()
                self._close_step(None)
                self._end_training()

    def request_batch(self) -> None:
        """The loop asks for its next batch now: the batch in progress ends here (the step rule, module
        docstring), and the first request of an epoch starts its training time. For a trainer whose loop
        the caller does not own (scaling/integrations/): call it where the trainer fetches a batch."""
        if not self._feeding:
            self._begin_training()
            self._feeding = True
        entered = time.perf_counter()
        self._request = self.clock.mark() if self.timing else None
        self._end_evaluation(self._request)
        self._continues = self._end_micro_batch(self._request)
        self._host_s += time.perf_counter() - entered

    def batch_arrived(self, batch=None, samples: int | None = None) -> None:
        """The batch `request_batch` asked for is here: its samples (its first tensor's first dimension, or
        `samples` where the caller counts them) join the step it continues, or open the next step."""
        planted_s = 0.0
        if self.settings.inject_data_delay_s:  # ground truth: the batch came this much later (its wait, data_s)
            began = time.perf_counter()
            time.sleep(self.settings.inject_data_delay_s)
            planted_s = time.perf_counter() - began
        entered = time.perf_counter()
        if samples is None:
            samples = batch_samples(batch)
        self._per_rank_batch = self._per_rank_batch or samples
        self._epoch_samples += samples
        if not self.timing:
            self._epoch_steps += 1
            self.global_step += 1
        elif self._continues:
            self._step.samples += samples
            self._step.planted_s += planted_s
        else:
            self._close_step(self._request)
            self._epoch_steps += 1
            comm_timed = self._times_collectives(self.global_step)
            self.backend.time_collectives(comm_timed)
            self._step = _OpenStep(self._request, self.global_step, samples, comm_timed)
            self._step.planted_s = planted_s
            self.global_step += 1
        self._host_s += time.perf_counter() - entered

    def end_batches(self) -> None:
        """The epoch's last batch has ended (push API): as a request for a batch that does not come, it ends
        the last micro-batch; the step in progress is recorded and the epoch's training time stops. Nothing
        where no epoch is training."""
        if self._feeding:
            self.request_batch()
            self._batches_ran_dry()

    def _batches_ran_dry(self) -> None:
        self._feeding = False
        self._close_step(self._request)
        self._end_training()

    def _times_collectives(self, step: int) -> bool:
        """Whether training step `step` times its collectives: every warm-up step, the first N steady ones (at
        most `FIRST_TIMED_STEPS`), then every Nth, N = `collective_timing_every` (settings.py)."""
        if not self.backend.samples_collectives:
            return True
        steady, every = step - self.settings.warmup_steps, self.settings.collective_timing_every
        return steady < min(every, FIRST_TIMED_STEPS) or steady % every == 0

    def _end_micro_batch(self, request) -> bool:
        """The batch in progress ends at `request`: whether the next batch continues its step (rule, module
        docstring)."""
        step = self._step
        if step is None:
            return False
        step.boundary(step.phase, request)
        buckets = self.backend.take()
        if step.forwarded or step.stepped or buckets:
            step.micro_buckets.append(buckets)
        if not step.forwarded and not step.stepped:
            continues = True  # a skipped batch: its time is waiting for the next one's data
        elif step.stepped:
            continues = False
        else:
            continues = not self.backend.gradients_cleared()
        step.phase, step.forwarded, step.stepped = "data", False, False
        return continues

    def _begin_training(self) -> None:
        if self.run_first_step_unix is None:
            first_step_unix = time.time()
            self.first_step_unix = first_step_unix
            # The run's clock starts at its first attempt's first step, so wall figures include restarts.
            self.run_first_step_unix = (
                (self._resumed_from or {}).get("run_first_step_unix")
                or self.recorder.first_attempt_unix()
                or first_step_unix
            )
            self.recorder.record_attempt(first_step_unix, resumed_from=self._resumed_from)
        if self.clock.cuda:
            torch.cuda.synchronize()  # epoch boundaries only: train_s is host wall time
        self.clock.anchor()  # GPU: the epoch's events placed on the host clock (cross-rank attribution, trace)
        self._epoch_steps = self._epoch_samples = 0
        self._paused_s = self._host_s = 0.0
        self._training_end = None
        self._thread_usage = ThreadUsage()
        self._paused_usage: list[dict] = []
        self._peak_memory.begin()
        self._train_started = time.perf_counter()

    def _close_step(self, end) -> None:
        """Record the step in progress, ending at `end` (the next request), or at its optimizer's end."""
        step, self._step = self._step, None
        if step is None:
            return
        if end is None:  # the loop left `batches` inside the step
            if step.optimizer_end is None:
                return  # before stepping: no whole step to record
            step.boundary(step.phase, step.optimizer_end)
            if step.forwarded or step.stepped:
                step.micro_buckets.append(self.backend.take())
        elif not step.micro_buckets:
            return  # nothing was trained: batches drawn and skipped up to the loader's end
        norms = self.backend.take_norms()  # before host_s is read: taking them is the instrument's time
        if norms is not None:  # the rank's samples in the step, and the global batch's (equal per rank)
            norms = (*norms, step.samples, step.samples * self.world_size)
        host_s, self._host_s = self._host_s + self.backend.take_host_s(), 0.0
        marks = StepMarks(
            self.epoch + 1,
            step.index,
            "train",
            step.index < self.settings.warmup_steps,
            step.samples,
            step.start,
            step.segments,
            step.micro_buckets,
            step.pauses,
            step.optimizer_steps,
            comm_rule=self.backend.comm_rule,
            comm_timed=step.comm_timed,
            instrument_host_s=host_s,
            planted_s=step.planted_s,
            wrapper=step.wrapper,
            job_collectives=step.job_collectives,
            grad_norms=norms,
        )
        if norms is not None and not marks.warmup:
            self._noise_steps.append(marks)
        self.recorder.step(marks)

    def _end_training(self) -> None:
        if self.clock.cuda:
            torch.cuda.synchronize()
        self._training_end = time.perf_counter()
        # the thread's counters over train_s only: without the evaluations it was paused for
        usage = self._thread_usage.stop()
        for paused in self._paused_usage:
            usage = {k: v - paused[k] for k, v in usage.items()}
        self._training_thread = usage
        self._epoch_peak_memory = self._peak_memory.end()

    # --- end of an epoch -----------------------------------------------------------------

    def end_epoch(self, val_accuracy: float | None = None, samples: int | None = None, **columns) -> dict:
        """Close the epoch: A/B calibration, the epoch's row, records written. Every rank calls it.

        `val_accuracy` (the metric the target applies to) and `samples` (trained this epoch,
        all ranks; by default this rank's samples x world size) are what only the job knows;
        further `columns` (train_loss, lr, ...) go into the epoch's row as they are.
        Returns the row.
        """
        if self._train_started is None:
            raise RuntimeError("end_epoch() before any batch of the epoch: iterate meter.batches(loader) first")
        if self._training_end is None:
            self._end_evaluation()
            self._close_step(None)
            self._end_training()
        train_s = self._training_end - self._train_started - self._paused_s
        training_thread = self._training_thread
        peak_memory_bytes, peak_memory_method = self._epoch_peak_memory
        self._memory_epochs.append(
            {"epoch": self.epoch + 1, "peak_memory_bytes": peak_memory_bytes, "peak_memory_method": peak_memory_method}
        )
        self.recorder.write_rank_json("memory", {"epochs": self._memory_epochs})
        # the job's own validation, between training and here, and any evaluation it paused training for
        eval_s = time.perf_counter() - self._training_end + self._paused_s
        self.elapsed_train_s += train_s
        self.record_eval(
            val_accuracy,
            epoch_progress=float(self.epoch + 1),
            **{k: v for k, v in columns.items() if k.startswith("val_")},
        )
        if self.epoch == 0:
            self.recorder.write_json(JOB_JSON, self.observed())
            if self._input_shape is not None or self._input_problem is not None:
                with rng_untouched(self.device):  # its probes draw random inputs
                    self._profile_compute()
        calibration_start = time.perf_counter()
        self.calibration.calibrate()
        if self.clock.cuda:
            torch.cuda.synchronize()
        calibration_s = time.perf_counter() - calibration_start
        columns = {**self._epoch_noise_scale(), **columns}
        self.epoch += 1
        samples = samples if samples is not None else self._epoch_samples * self.world_size
        row = {
            "epoch": self.epoch,
            "train_s": train_s,
            "eval_s": eval_s,
            "calibration_s": calibration_s,
            "val_accuracy": float("nan") if val_accuracy is None else float(val_accuracy),
            "samples": samples,
            "steps": self._epoch_steps,
            "num_workers": self.world_size,  # per epoch: an elastic run's worker count can change at a restart
            "throughput_samples_per_s": samples / train_s if train_s > 0 else float("nan"),
            "elapsed_train_s": self.elapsed_train_s,
            # wall time from the run's first step (first attempt) to the end of this epoch's validation
            "elapsed_wall_s": time.time() - self.run_first_step_unix,
            "first_step_unix": self.first_step_unix,
            **training_thread,  # was the loop slow, or kept off its core? (thread_usage.py)
            # this rank's peak memory over the epoch's training (memory.py); over the ranks once recorded
            "peak_memory_bytes": peak_memory_bytes,
            "peak_memory_method": peak_memory_method,
            **columns,
        }
        if self.second_opinion is not None:
            row.update(self.second_opinion.epoch_figures())
        rows = self.recorder.end_epoch(row, self._telemetry.drain() if self._telemetry else [], self._evals)
        if self.live is not None:
            self.live.update(rows, row)
        self._evals = []
        self._train_started = None
        return row

    @contextlib.contextmanager
    def paused(self):
        """Stop the training clock inside an epoch, e.g. for an evaluation every fraction of one.

        The paused time is taken out of the step in progress and counts in the epoch's
        `eval_s`, never in `train_s`, a step or TTA. An evaluation's forwards pause the clock
        by themselves (module docstring); `paused()` also covers what comes before the first
        of them (building a loader, say) and work that runs no forward:

            with meter.paused():
                accuracy = evaluate(model)
                meter.record_eval(accuracy, epoch_progress=epoch + fraction)
        """
        if self.clock.cuda:
            torch.cuda.synchronize()
        self._end_evaluation()
        if self._pause is not None:  # nested in another paused(): the outer one holds the clock
            yield
            return
        self._begin_pause(automatic=False)
        try:
            yield
        finally:
            if self.clock.cuda:
                torch.cuda.synchronize()
            self._end_pause()

    def record_job_collective(self, kind: str, seconds: float) -> None:
        """A collective the job runs beside its gradients' (the HF Trainer's token all-gather), timed on the host by
        its caller: added to the step in progress as `<kind>_s` (seconds, summed) and `<kind>s` (how many), on
        every step, sampled or not. `kind` is one of scaling/analysis/run_metrics.py's `JOB_KINDS`, whose figures
        the summary gives; nothing is recorded outside a training step."""
        step = self._step
        if step is None:
            return
        if step.job_collectives is None:
            step.job_collectives = {}
        total = step.job_collectives.setdefault(kind, [0.0, 0])
        total[0] += seconds
        total[1] += 1

    def record_eval(self, val_accuracy: float | None, epoch_progress: float, **columns) -> None:
        """An evaluation's result, with the training time up to it (evals.parquet; TTA's first-eval rule).

        Inside `paused()` the training time is the epoch's up to the pause; at the end of an
        epoch (end_epoch calls this) all of the epoch's.
        """
        if self._pause_started is not None:
            trained = self.elapsed_train_s + (self._pause_started - self._train_started - self._paused_s)
        else:
            trained = self.elapsed_train_s
        self._evals.append(
            {
                "epoch": self.epoch + 1,
                "epoch_progress": float(epoch_progress),
                "step": self.global_step,
                "elapsed_train_s": trained,
                "elapsed_wall_s": time.time() - self.run_first_step_unix,
                "val_accuracy": float("nan") if val_accuracy is None else float(val_accuracy),
                **columns,
            }
        )

    def _epoch_noise_scale(self) -> dict:
        """The epoch's gradient noise scale and its interval (scaling/noise_scale.py), from its steady steps'
        norms (more than one rank) or the calibration window's (one): the epoch row's `noise_scale`,
        `noise_scale_low`, `noise_scale_high`, `grad_trace`, `grad_sq`, `noise_steps`, `noise_blocks`; nothing
        where neither was measured. The norms are read here, once per epoch, after the epoch's synchronize."""
        for marks in self._noise_steps:
            before, after, factor, batch_small, batch_big = marks.grad_norms
            if any(norm is None for norm in after):  # an all-reduce that never completed: no figure
                marks.grad_norms = None
                continue
            small_sq = factor * float(torch.stack(before).sum())
            marks.grad_norms = (small_sq, float(torch.stack(after).sum()), batch_small, batch_big)
        steps = [m for m in self._noise_steps if m.grad_norms is not None]
        measured = [m.grad_norms for m in steps]
        if self._norms_on and self.sync_group is not None:
            measured = self._pooled_over_ranks(measured)
            if self.backend.norms_sharded:  # a step row's |G_big|² is the whole gradient's, as DDP's, or none
                for i, marks in enumerate(steps):
                    marks.grad_norms = (
                        (marks.grad_norms[0], measured[i][1], *marks.grad_norms[2:]) if measured else None
                    )
        measured += self._noise_window
        self._noise_steps, self._noise_window = [], []
        return noise_scale.estimate(measured) if measured else {}

    def _pooled_over_ranks(self, measured: list[tuple]) -> list[tuple]:
        """Each step's |G_small|² as the mean over the ranks' own (collective: every rank calls it at the epoch's
        end). Every rank's is an unbiased small-batch norm of the same step, so their mean is too, with less
        noise; the global batch's norm is the same on every rank (DDP), or the sum of the ranks' shards' (FSDP2:
        `norms_sharded`). The ranks time the same steps (the sampling is by step index); a count that differs
        leaves each rank its own (the records keep each rank's own anyway), and a sharded run no figure."""
        sharded = self.backend.norms_sharded
        count = torch.tensor([float(len(measured))], dtype=torch.float64)
        counts = [torch.zeros_like(count) for _ in range(self.world_size)]
        dist.all_gather(counts, count, group=self.sync_group)
        if not measured or any(int(c.item()) != len(measured) for c in counts):
            return [] if sharded else measured
        pooled = torch.tensor([[m[0], m[1] if sharded else 0.0] for m in measured], dtype=torch.float64)
        dist.all_reduce(pooled, group=self.sync_group)
        small = (pooled[:, 0] / self.world_size).tolist()
        big = pooled[:, 1].tolist() if sharded else [m[1] for m in measured]
        return [(s, b, *rest) for s, b, (_, _, *rest) in zip(small, big, measured)]

    def _profile_compute(self) -> None:
        """Training FLOPs per sample (counted on the meta device) and the device's roofs.

        Counted at the input shape and dtype of the first batch: a classifier's step (cross-entropy
        over the model's last output dimension), or a language model's (token ids in, cross-entropy
        over the vocabulary per token: flops.py). A model this cannot count (other inputs, other
        losses) gets no profile, and so no MFU, rather than a wrong one; the input's shape and
        dtype are written either way (a run's tokens per sample: scaling/analysis/run_metrics.py).
        """
        from scaling.instrument import flops

        threads = torch.get_num_threads()
        if self._input_shape is None:  # the input was not understood (inputs.model_input): its reason, no guess
            self.recorder.write_json(
                COMPUTE_PROFILE_JSON,
                {"error": f"input not understood: {self._input_problem}", "precision": self._precision},
            )
            return
        observed_input = {
            "input_shape": list(self._input_shape[1:]),
            "input_dtype": str(self._input_dtype).removeprefix("torch."),
            "input_keyword": self._input_keyword,
        }
        if self._real_tokens_per_sample is not None:
            observed_input["real_tokens_per_sample"] = self._real_tokens_per_sample
        try:
            counts = flops.training_flops_per_sample(
                self.flops_module,
                self._input_shape[1:],
                self._num_outputs or 2,
                input_dtype=self._input_dtype or torch.float32,
                input_keyword=self._input_keyword,
            )
        except Exception as exc:  # noqa: BLE001 - any model the counter cannot run
            self.recorder.write_json(
                COMPUTE_PROFILE_JSON,
                {
                    "error": f"FLOPs not counted: {type(exc).__name__}: {exc}",
                    "precision": self._precision,
                    **observed_input,
                },
            )
            return
        traffic = flops.training_bytes_per_sample(
            counts, self._per_rank_batch or 1, bytes_per_element=4 if self._precision == "fp32" else 2
        )
        profile = {
            "precision": self._precision,
            **observed_input,
            "per_worker_batch": self._per_rank_batch,
            **counts,
            "train_bytes_per_sample": traffic["bytes_per_sample"],
            "bytes_method": traffic["method"],
            **flops.device_roofs(self.device, self._precision, threads, measure=self.rank == 0),
        }
        units = self.backend.sharded_units()
        if units:
            profile["sharded_units"] = [list(unit) for unit in units]
        self.recorder.flops_per_sample = profile["train_flops"]
        self.recorder.write_json(COMPUTE_PROFILE_JSON, profile)

    def observed(self) -> dict:
        """What the instrument saw of the job (written to job.json; a summary's description of it)."""
        return {
            "model": type(self.flops_module).__name__,
            "backend": self.backend.observed_backend(),
            "data_parallel": self.backend.kind,
            "per_step_settings": self.backend.per_step_settings(),
            "precision": self._precision,
            "per_worker_batch": self._per_rank_batch,
            "ab_calibration": bool(
                self.forward_backward and self.calibration_data is not None and self.settings.calibration_pairs > 0
            ),
        }

    # --- checkpoints and the end ---------------------------------------------------------------

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the instrument: counters, the run's clock, the records so far."""
        return {
            "epoch": self.epoch,
            "global_step": self.global_step,
            "elapsed_train_s": self.elapsed_train_s,
            "run_first_step_unix": self.run_first_step_unix,
            "saved_unix": time.time(),
            "records": self.recorder.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue a restarted run from a checkpoint's `state_dict()` (before its first batch)."""
        self.epoch, self.global_step = state["epoch"], state["global_step"]
        self.elapsed_train_s = state["elapsed_train_s"]
        self._resumed_from = state
        self.recorder.load_state_dict(state["records"])

    def detach(self) -> None:
        """Remove the hooks and stop telemetry (the comm timer stays: DDP cannot unregister it)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._telemetry is not None:
            self._telemetry.stop()
            self._telemetry = None

    def __enter__(self) -> StepMeter:
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        """Leaving `with attach(...) as meter:`: detach, and finish the run unless the job did.

        An exception inside the block makes the run `failed`, with the error; the epochs that
        ended are recorded (each epoch's records are written at its end). The exception goes on.
        """
        if self._finished:
            return False
        if error is None:
            self.finish()
        else:
            self.finish(status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0])
        return False

    def finish(self, status: str | None = None, error: str | None = None) -> dict | None:
        """End of the run: detach; on rank 0 of a job on its own, its finisher writes summary.json.

        Returns the summary on rank 0 of a job with a finisher (on its own: not under `scaling run`,
        whose launcher writes it), else None.
        """
        self.detach()
        self._finished = True
        try:
            return self._finish(status, error)
        finally:
            if self._writer_lock is not None:
                self._writer_lock.release()
                self._writer_lock = None

    def _finish(self, status: str | None, error: str | None) -> dict | None:
        if self.finisher is None or self.run_dir is None:
            return None
        if status is None and self.sync_group is not None:
            # every rank has written its last epoch's records (after end_epoch's collectives) before
            # rank 0 reads them all for the summary: without it, rank 0 could summarise its own alone
            dist.barrier(group=self.sync_group)
        if self.rank != 0:
            return None
        description = {
            "name": self.name,
            "dataset": None,
            "launcher": "own",
            "num_workers": self.world_size,
            "global_batch": (self._per_rank_batch or 0) * self.world_size,
            "seed": None,
            "target_accuracy": self.target_accuracy,
            "target_metric": "val_loss" if self.target_loss is not None else "val_accuracy",
            "target_loss": self.target_loss,
            "grad_compression": None,
            "step_timing": self.timing,
            "inject_comm_delay_s": self.settings.inject_comm_delay_s,
            **self.observed(),
        }
        return self.finisher(
            self.run_dir,
            description,
            status=status,
            error=error,
            started_at=self._started_at,
            wall_s=time.time() - self.attached_unix,
        )


def _precision_seen(device: torch.device, backend) -> str:
    """The compute precision at a forward's call: autocast's, else the backend's cast (FSDP2's policy), else the
    parameters' dtype. Autocast entered inside the forward is not seen here (attach's `precision`)."""
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    else:
        dtype = backend.compute_dtype()
        if dtype is None:
            parameter = next((q for q in backend.plain_model.parameters() if q.is_floating_point()), None)
            dtype = parameter.dtype if parameter is not None else torch.float32
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def attach(model, optimizer, *, settings: InstrumentSettings | None = None, parts: Parts | None = None, **keywords):
    """Attach the instrument to a training job's model and optimizer (module docstring); returns its
    StepMeter.

    - `model`: the DDP model (or the plain module at world size 1); with Horovod the module
      whose optimizer is `hvd.DistributedOptimizer`.
    - `keywords`: the job's description, any field of `Job` (`run_dir`, `forward_module`,
      `flops_module`, `forward_backward`, `calibration_data`, `name`, `target_accuracy`,
      `target_loss`, `precision`: its docstrings say what each is for), and any field of
      `InstrumentSettings` on top of `settings` (`warmup_steps=3`).
    - `settings` (`InstrumentSettings`): without it, those of the run a launcher handed this
      process, else the defaults.
    - `parts` (`Parts`: identity, live metrics, finisher) from whoever runs the job; without
      them, those the installed providers give (scaling/instrument/parts.py). A run a launcher
      handed over is finished by that launcher: no finisher.
    """
    job_fields = [f.name for f in fields(Job)]
    setting_fields = [f.name for f in fields(InstrumentSettings)]
    unknown = sorted(set(keywords) - set(job_fields) - set(setting_fields))
    if unknown:
        raise TypeError(
            f"attach: unknown keyword(s) {unknown}; the job's: {', '.join(job_fields)}; "
            f"the instrument's settings: {', '.join(setting_fields)}"
        )
    job = Job(**{key: value for key, value in keywords.items() if key in job_fields})
    overrides = {key: value for key, value in keywords.items() if key not in job_fields}
    launched = LaunchedRun.from_environment()
    if settings is None:
        settings = launched.settings if launched is not None else InstrumentSettings()
    settings = settings.instrument_only(**overrides)
    problems = settings.problems()
    if problems:
        raise ValueError(f"instrument setting {problems[0]}")
    if launched is not None:  # a launcher's run: its directory and name unless the job gives its own
        job = replace(job, run_dir=job.run_dir if job.run_dir is not None else launched.run_dir)
        job = replace(job, name=job.name or launched.name)
    run_dir = job.run_dir
    parts = parts if parts is not None else installed_parts()
    if launched is not None:
        parts = Parts(identity=parts.identity, live_metrics=parts.live_metrics)
    elif parts.finisher is None and run_dir is not None:
        warnings.warn(
            f"scaling.instrument: no finisher, so {run_dir} will hold the records but no summary.json "
            "(the lab registers its finisher when installed: pip install scaling-lab; or pass "
            "parts=Parts(finisher=...))",
            stacklevel=2,
        )
    return StepMeter(model, optimizer, job, settings=settings, parts=parts)
