"""FSDP2 (`torch.distributed.fsdp.fully_shard`): every all-gather and reduce-scatter timed, what
compute waited for, and an A/B window without the reduce-scatters.

What FSDP2 communicates. Each module given to `fully_shard` (each transformer block, then the
root) holds its parameters sharded across the ranks, in one FSDP parameter group. Per training
pass and per such module: an **all-gather** of its parameters before its forward; in backward a
**re-gather** (an all-gather again) where the parameters were resharded after forward
(`reshard_after_forward`, FSDP's default for all but the root), and a **reduce-scatter** of its
gradients once they are computed (each rank keeps its shard of the sum). FSDP calls both
collectives through objects of its own (`AllGather`, `ReduceScatter`, which
`FSDPModule.set_custom_all_gather` / `set_custom_reduce_scatter` replace: torch 2.13's
torch/distributed/fsdp/_fully_shard/_fsdp_api.py).

How it is timed. `install_timer` wraps every parameter group's two objects (FSDP's own, or those
the job set before attaching: attach after configuring FSDP's communication) in timed ones that
call them and mark each collective (`BucketMarks`, one per collective: `kind`, `nbytes`,
`module`, `backward`): issued (`handed_over`) and done (`completed`) on the run's clock. Only on
the steps the meter samples (`collective_timing_every`, as DDP's buckets): on the others FSDP's
own objects and wait methods are back in place (`ShardedCommTimer.set_timed`), so the instrument
runs no Python per collective, or, with a ground-truth delay to hold, the timed objects call
through unmarked; the step's communication columns are empty. The timer books its own Python
around each marked collective into the step's `instrument_host_s`.
- CPU (gloo): FSDP calls both synchronously (`async_op=False`) on the training thread, so the
  marks before and after the call are its true start and end, and the thread computed nothing
  in between. An asynchronous unshard (`FSDPModule.unshard(async_op=True)`) returns a Work; its
  end is marked by a callback on the Work's future (gloo's thread, when it completes).
- GPU (NCCL), **no collective yet timed on a GPU** (one GPU holds one NCCL rank, and FSDP2 issues no
  collective at world size 1; a 1-rank job on an H200 ran, docs/gpu.md): a mark is a CUDA event on
  the current stream, and FSDP calls the collective with its own stream current (the all-gather
  stream, the reduce-scatter stream), so the events around the call are the collective's start and
  end on that stream (ProcessGroupNCCL makes the current stream wait for a synchronous collective);
  no synchronize anywhere, the events are read at the epoch's end (timing.py). What compute waited
  for is marked on the compute stream (below). Unverified on a GPU: that NCCL's work sits between
  the two events on FSDP's stream, and that FSDP's compute stream waits where the rule below says
  (torch 2.13's `wait_for_unshard`, `post_backward`, `finalize_backward`).
Only training passes are recorded: an all-gather in a forward of the model with gradients off or
in eval mode (an evaluation, which the meter takes out of the step) is not; the model's forward
is seen by a pre-hook placed first, since FSDP all-gathers under `no_grad`.

The figures of a step (`ShardedCommRule`, in the step records; one row per collective in
collectives.parquet). Definitions, once, here:
- `allgather_s`, `reducescatter_s`: time with at least one collective of that kind in flight
  (the union of its [issued, done] intervals); `regather_s`: the backward re-gathers' part of
  `allgather_s`; `comm_s`: time with any collective in flight. `allreduce_s` is absent (NaN):
  FSDP all-reduces nothing (the replicas' all-reduce of HSDP is not timed).
- `allgather_bytes`, `regather_bytes`, `reducescatter_bytes` and counts `allgathers`,
  `regathers`, `reducescatters`: the bytes are nccl-tests' size, the whole buffer (the gathered
  parameters of an all-gather, the gradients a reduce-scatter reduces).
- bus bandwidth by nccl-tests' definition for both kinds: busbw = algbw x (n-1)/n, algbw = size /
  time, n the ranks of the collective's group; per step and kind `allgather_busbw_bytes_per_s`
  and `reducescatter_busbw_bytes_per_s` = sum of sizes / sum of durations x (n-1)/n (NaN
  without one); per collective in collectives.parquet.
- **`exposed_comm_s`: the time compute waited for a collective**: the length of the union, over
  the step's collectives, of their wait intervals [waited_from, done] (empty where done came
  first), waited_from being the moment the compute stream (the training thread on CPU, the
  current CUDA stream on GPU) began to wait for that collective:
    - a collective whose call held the training thread until it was done (FSDP's default on
      CPU): from its issue: all of it is exposed, since gloo ran it while the thread that would
      compute waited;
    - an all-gather that ran beside compute (its own CUDA stream; an asynchronous unshard): from
      the moment compute reached its module's unshard wait (FSDP's `wait_for_unshard`, in the
      module's pre-forward or pre-backward): zero where it was prefetched in time;
    - a reduce-scatter that ran beside compute (GPU): FSDP keeps at most
      `reduce_scatter_max_input_buffers` (default 1) in flight and makes compute wait for the
      oldest at the next module's post-backward: from that post-backward's start; the last ones
      of a backward are waited for at its end (`finalize_backward`): from their own module's
      post-backward start, when its gradients were computed (DDP's rule for its last bucket).
  `exposed_allgather_s`, `exposed_reducescatter_s`: the same union per kind (on CPU they add up
  to `exposed_comm_s`; on GPU two waits may overlap); `exposed_forward_comm_s`: the same union over
  the forward all-gathers, the part of the exposed time inside the forward phase (the rest is in
  backward). `compute_s` = step - data - exposed, as
  for DDP; the exposed time lies in forward and in backward.
- `synced_micro_batches`: those with a reduce-scatter (`set_requires_gradient_sync(False)`
  accumulation leaves them out); `num_buckets`: the step's collectives; `comm_span_s`: per
  micro-batch, first collective issued to last done.
- waiting and transfer (recorder.attribute): every collective is a sync point, the same
  sequence on every rank (FSDP issues them in module order): a rank waited for the slowest by
  min(its wait there, latest issue - its issue) at each, summed.

The A/B window (`no_sync`): `set_requires_gradient_sync(False)` on every FSDP module, so the
no_sync half's backward runs **no reduce-scatter**; its all-gathers (forward and backward
re-gather) run as in the synchronised half. The A/B difference (sync - no_sync) is therefore
what the reduce-scatters cost one micro-batch: their exposed time, their interference with
compute, FSDP's post-reduce work (the division, the sharded gradient's accumulation), minus what
keeping whole gradients costs the no_sync half. It **cannot see the all-gathers**: there is no
FSDP pass without them (a forward needs each module's whole parameters), so their cost is only in
the exposed figures (`exposed_allgather_s`) and in `allgather_s`. The unsharded gradients the
no_sync half leaves in FSDP's parameters are dropped on leaving it, and the job's own (an
accumulation in progress) set aside around the whole window (`calibration`), which reshards every
unit first so that the gradients the window's reduce-scatters leave are on the parameters the
meter clears (a unit kept gathered, the root after an evaluation, names its unsharded ones): the
A/B changes nothing in the training.

Ground truth (`inject_comm_delay_s`, `inject_comm_delay_into`): "gradients" holds the last
reduce-scatter of every synchronised backward (of the module whose reduce-scatter came last in
the previous one: FSDP issues them in the same order every pass, so the first synchronised
backward gets none); "parameters" holds the first all-gather of every training forward,
synchronised or not, so it moves the exposed time and not the A/B. On CPU a sleep inside the
collective's call after gloo's returned; on GPU a spin kernel on the collective's stream
(`torch.cuda._sleep`, as DDP's, which an H200 checked; this one has not run on a GPU:
`GPU_INJECTION_CHECKED` below). An all-gather that runs asynchronously
gets none (FSDP waits on its Work, not on this module's callback).

Relies on torch 2.13's FSDP2 internals, checked at attach (a refusal in one line names what is
missing): a module's `_get_fsdp_state()._fsdp_param_groups` (one `_fsdp_param_group` in torch 2.11),
a group's `_all_gather_comm` and `_reduce_scatter_comm` (what `set_custom_*` set), `fsdp_params`,
`wait_for_unshard`, `post_backward`, `reduce_grads`, `all_reduce_grads`,
`comm_ctx.reduce_scatter_max_input_buffers`, a parameter's `sharded_param`, `_unsharded_param` and
`unsharded_accumulated_grad` (an accumulation without synchronisation keeps the gradients there:
`gradients_cleared`, the no_sync half); and `torch._C._current_graph_task_id` (FSDP's own test for
backward).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from scaling.instrument.backends.base import Backend
from scaling.instrument.timing import BucketMarks, Clock, CommRule, interval_union_s, spin_cycles_per_s, squared_norm
from scaling.schema import REGATHER, SHARDED_COLLECTIVES

# FSDP2's device-side injection (a spin on the collective's stream) has not run on a GPU: one GPU
# holds one NCCL rank, and FSDP2 issues no collective at world size 1 (docs/gpu.md). False refuses
# instrument.inject_comm_delay_s on GPU runs of backend fsdp at preflight.
GPU_INJECTION_CHECKED = False

KINDS = tuple(SHARDED_COLLECTIVES)  # FSDP2's names; the records' columns are SHARDED_COLLECTIVES' values
_GROUP_ATTRIBUTES = (
    "_all_gather_comm",
    "_reduce_scatter_comm",
    "fsdp_params",
    "wait_for_unshard",
    "post_backward",
    "reduce_grads",
    "all_reduce_grads",
    "comm_ctx",
)


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1  # what FSDP's own is_bw() asks


def _fsdp_modules(model) -> list[tuple[str, FSDPModule]]:
    return [(name, module) for name, module in model.named_modules() if isinstance(module, FSDPModule)]


def _param_groups(module: FSDPModule) -> list | None:
    """The module's FSDP parameter groups: torch 2.13's `_fsdp_param_groups`, or the one
    `_fsdp_param_group` of earlier torch (2.11 on an H200, docs/gpu.md); None: neither."""
    state = module._get_fsdp_state()
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    if hasattr(state, "_fsdp_param_group"):
        return [state._fsdp_param_group] if state._fsdp_param_group is not None else []
    return None


class FSDPBackend(Backend):
    """A model whose modules were sharded with `fully_shard` (see the module docstring)."""

    kind = "fsdp"
    wraps = "a model sharded with fully_shard (FSDP2)"
    injectable = ("gradients", "parameters")
    samples_collectives = True
    paces_collectives = True

    def __init__(self, model, optimizer):
        super().__init__(model, optimizer)
        self._timer: ShardedCommTimer | None = None
        self._rule = ShardedCommRule()
        self._probe_param = None  # the FSDP parameter behind the gradient probe (gradients_cleared)

    @classmethod
    def claims(cls, model, optimizer) -> bool:
        return any(isinstance(module, FSDPModule) for module in model.modules())

    def _groups(self) -> list:
        return [group for _, module in _fsdp_modules(self.model) for group in _param_groups(module) or []]

    def compute_dtype(self) -> torch.dtype | None:
        # FSDP2 casts the gathered parameters to the policy's param_dtype: a bf16 policy computes
        # in bf16 without autocast, and its MFU is against the bf16 peak
        dtypes = {group.mp_policy.param_dtype for group in self._groups()} - {None}
        return dtypes.pop() if len(dtypes) == 1 else None

    def sharded_units(self) -> list[tuple[str, int, bool]]:
        # labelled as the timer labels the units' collectives (collectives.parquet's `module`); read
        # after the first forward, when FSDP has decided that the root keeps its parameters
        units = []
        for name, module in _fsdp_modules(self.model):
            groups = _param_groups(module) or []
            for i, group in enumerate(groups):
                label = (name or "root") + (f"[{i}]" if len(groups) > 1 else "")
                params = sum(p._orig_size.numel() for p in group.fsdp_params)
                units.append((label, params, group.post_forward_mesh_info is not None))
        return sorted(units, key=lambda unit: unit[0] != "root")

    def gradients_cleared(self) -> bool:
        # accumulating without synchronisation, FSDP keeps the gradients on its unsharded
        # parameters: the sharded one's .grad stays None until a reduce-scatter
        probe = self._grad_probe
        if probe is None or probe.grad is not None:
            return probe is None
        if self._probe_param is None:
            self._probe_param = next(
                (param for group in self._groups() for param in group.fsdp_params if param.sharded_param is probe),
                False,
            )
        if not self._probe_param:
            return True
        unsharded = getattr(self._probe_param, "_unsharded_param", None)
        return self._probe_param.unsharded_accumulated_grad is None and (unsharded is None or unsharded.grad is None)

    def install_timer(self, clock: Clock, inject_delay_s: float = 0.0, inject_into: str = "gradients") -> None:
        self._timer = ShardedCommTimer(self.model, clock, self._rule, inject_delay_s, inject_into)

    @property
    def comm_rule(self) -> CommRule:
        return self._rule

    @contextlib.contextmanager
    def no_sync(self):
        """Backward without reduce-scatters (`set_requires_gradient_sync(False)`); module docstring."""
        groups = self._groups()
        flags = [(group, group.reduce_grads, group.all_reduce_grads) for group in groups]
        saved = _set_aside_unsharded_gradients(groups)
        for _, module in _fsdp_modules(self.model):
            module.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for group, reduce_grads, all_reduce_grads in flags:
                group.reduce_grads, group.all_reduce_grads = reduce_grads, all_reduce_grads
            _put_back_unsharded_gradients(saved)  # drops what the block accumulated

    @contextlib.contextmanager
    def calibration(self):
        """The job's unsharded gradients set aside, and every unit resharded (`_reshard_everything`) so that
        the model names the sharded parameters, whose gradients the meter clears and gives back."""
        saved = _set_aside_unsharded_gradients(self._groups())
        self._reshard_everything()
        try:
            yield
        finally:
            _put_back_unsharded_gradients(saved)

    def take(self) -> list[BucketMarks]:
        return self._timer.take() if self._timer is not None else []

    def set_pace(self, pace) -> None:
        self._timer.pace = pace

    # each rank's reduce-scatter output is its shard of the averaged gradient: the meter sums the ranks'
    norms_sharded = True

    def measure_norms(self, on: bool) -> None:
        if self._timer is not None:
            self._timer.norms = on

    def take_norms(self):
        return self._timer.take_norms() if self._timer is not None else None

    def time_collectives(self, timed: bool) -> None:
        if self._timer is not None:
            self._timer.set_timed(timed)

    def take_host_s(self) -> float:
        if self._timer is None:
            return 0.0
        host_s, self._timer.host_s = self._timer.host_s, 0.0
        return host_s

    def observed_backend(self) -> str:
        return "fsdp"

    def checkpoint_state(self) -> dict:
        """The whole model and optimizer state, keyed by parameter name, gathered from every rank's shards onto
        rank 0's CPU (torch.distributed.checkpoint.state_dict's `get_state_dict`, full state dicts): a
        collective, every rank calls it; the other ranks get empty dicts. A checkpoint of it loads at any
        world size (`load_checkpoint_state` takes each rank's shard)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_state, optimizer_state = get_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return {"model": model_state, "optimizer": optimizer_state}

    def load_checkpoint_state(self, state: dict) -> None:
        """Every rank, with the whole state of `checkpoint_state`: each keeps its shard (`set_state_dict`)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(full_state_dict=True),
        )

    def _reshard_everything(self) -> None:
        """Register every unit's sharded parameters again. FSDP2 keeps the root gathered after a forward
        without backward (an evaluation), every unit with `reshard_after_forward=False`; a module so left
        names its unsharded parameters, not the sharded ones that the reduce-scatter gives gradients to
        and the optimizer steps. Values are unchanged: the next forward gathers the unit again."""
        from torch.distributed.fsdp import FSDPModule

        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def _set_aside_unsharded_gradients(groups: list) -> list:
    """Take the unsharded gradients FSDP holds between backwards (an accumulation without
    synchronisation) out of its parameters; `_put_back_unsharded_gradients` restores them."""
    saved = []
    for group in groups:
        for param in group.fsdp_params:
            unsharded = getattr(param, "_unsharded_param", None)
            saved.append((param, unsharded.grad if unsharded is not None else None, param.unsharded_accumulated_grad))
            if unsharded is not None:
                unsharded.grad = None
            param.unsharded_accumulated_grad = None
    return saved


def _put_back_unsharded_gradients(saved: list) -> None:
    for param, grad, accumulated in saved:
        unsharded = getattr(param, "_unsharded_param", None)
        if unsharded is not None:
            unsharded.grad = grad
        param.unsharded_accumulated_grad = accumulated


class _Group:
    """One FSDP parameter group as the timer sees it: its label and the marks waiting on it."""

    __slots__ = ("label", "pending_all_gathers", "gradients_ready")

    def __init__(self, label: str):
        self.label = label
        self.pending_all_gathers: list[BucketMarks] = []  # issued beside compute, not yet waited for
        self.gradients_ready = None  # GPU: compute-stream mark at its post-backward's start


class TimedAllGather(AllGather):
    """FSDP's all-gather for one parameter group, timed (delegates to the one it wraps)."""

    def __init__(self, timer: ShardedCommTimer, group: _Group, inner: AllGather):
        self.timer, self.group, self.inner = timer, group, inner

    def allocate(self, size, *, dtype, device):
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return self.timer.all_gather(self, output_tensor, input_tensor, group, async_op)


class TimedReduceScatter(ReduceScatter):
    """FSDP's reduce-scatter for one parameter group, timed (delegates to the one it wraps)."""

    def __init__(self, timer: ShardedCommTimer, group: _Group, inner: ReduceScatter):
        self.timer, self.group, self.inner = timer, group, inner

    def allocate(self, size, *, dtype, device):
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return self.timer.reduce_scatter(self, output_tensor, input_tensor, group, op, async_op)


class ShardedCommTimer:
    """Marks every all-gather and reduce-scatter of an FSDP2 model (module docstring)."""

    def __init__(
        self, model, clock: Clock, rule: ShardedCommRule, inject_delay_s: float = 0.0, inject_into: str = "gradients"
    ):
        if inject_delay_s < 0:
            raise ValueError(f"inject_delay_s must be >= 0, got {inject_delay_s}")
        if inject_into not in ("gradients", "parameters"):
            raise ValueError(f"inject_comm_delay_into must be gradients or parameters, got {inject_into!r}")
        self.model, self.clock, self.rule = model, clock, rule
        self.stream_ordered = clock.cuda  # GPU: collectives run beside compute, on FSDP's streams
        self.inject_delay_s, self.inject_into = inject_delay_s, inject_into
        self.spin_cycles = int(round(inject_delay_s * spin_cycles_per_s())) if (inject_delay_s and clock.cuda) else 0
        self._marks: list[BucketMarks] = []  # since the last take, in issue order
        self._pending_reduce_scatters: list[BucketMarks] = []  # GPU: in flight, compute not yet waiting
        self._waiting_groups: list[_Group] = []
        self._last_reduce_scatter = None  # the module whose reduce-scatter came last in the previous backward
        self._parameters_injected = False
        self._in_flight = 1
        # False on a step the meter does not sample (`collective_timing_every`, `set_timed`)
        self.timed = True
        self.pace = None  # a paced 1-worker run's idle (the meter's), at each unshard and reduce-scatter point
        self.host_s = 0.0  # this timer's own Python around the collectives it marked, since the last take
        # The gradient noise scale's two norms (scaling/noise_scale.py) on timed steps where `norms` is set: each
        # reduce-scatter's input (this rank's whole gradient of the unit) and its output (this rank's shard of
        # the average), squared, as 0-d tensors read once per epoch: [[before, after], ...] since `take_norms()`.
        # Only where the output is the plain average over every rank (`_norms_before`).
        self.norms = False
        self._norms: list[list] = []
        # per parameter group: (group, its timed all-gather, its timed reduce-scatter, the waits' holder)
        self._installed: list[tuple] = []
        # FSDP all-gathers under no_grad: whether a forward trains is read as the model's forward
        # starts (first among its pre-hooks, before FSDP's own all-gathers the root's parameters)
        self._training_forward = False
        self._forward_hook = model.register_forward_pre_hook(self._on_forward, prepend=True)
        for name, module in _fsdp_modules(model):
            groups = _param_groups(module)
            if groups is None:
                raise ValueError(
                    "this torch's FSDP2 has neither _fsdp_param_groups nor _fsdp_param_group: the "
                    "instrument's FSDP adapter is written for torch 2.13's "
                    "(scaling/instrument/backends/fsdp.py)"
                )
            for i, param_group in enumerate(groups):
                missing = [a for a in _GROUP_ATTRIBUTES if not hasattr(param_group, a)]
                if missing:
                    raise ValueError(
                        f"this torch's FSDP parameter group has no {', '.join(missing)}: the instrument's "
                        "FSDP adapter is written for torch 2.13's (scaling/instrument/backends/fsdp.py)"
                    )
                label = (name or "root") + (f"[{i}]" if len(groups) > 1 else "")
                group = _Group(label)
                if not isinstance(param_group._all_gather_comm, TimedAllGather):
                    param_group._all_gather_comm = TimedAllGather(self, group, param_group._all_gather_comm)
                else:  # attached again: time on this timer
                    param_group._all_gather_comm.timer = self
                    group = param_group._all_gather_comm.group
                if not isinstance(param_group._reduce_scatter_comm, TimedReduceScatter):
                    param_group._reduce_scatter_comm = TimedReduceScatter(self, group, param_group._reduce_scatter_comm)
                else:
                    param_group._reduce_scatter_comm.timer = self
                holder = self._wrap_waits(param_group, group)
                self._installed.append(
                    (param_group, param_group._all_gather_comm, param_group._reduce_scatter_comm, holder)
                )
                self._in_flight = max(1, int(getattr(param_group.comm_ctx, "reduce_scatter_max_input_buffers", 1)))

    def _wrap_waits(self, param_group, group: _Group) -> list:
        """Mark where compute waits for this group's collectives (instance attributes over FSDP's methods).
        Returns the holder kept on the group: [timer, timed wait_for_unshard, timed post_backward, FSDP's
        wait_for_unshard, FSDP's post_backward]; a later attach on the same model re-points its timer."""
        holder = getattr(param_group, "_scaling_timer_waits", None)
        if holder is not None:
            holder[0] = self
            param_group.wait_for_unshard, param_group.post_backward = holder[1], holder[2]
            return holder
        wait_for_unshard, post_backward = param_group.wait_for_unshard, param_group.post_backward
        holder = [self, None, None, wait_for_unshard, post_backward]
        param_group._scaling_timer_waits = holder

        def timed_wait_for_unshard(*args, **kwargs):
            timer = holder[0]
            if timer.pace is not None and getattr(param_group, "_all_gather_result", None) is not None:
                timer.pace()  # an unshard that would all-gather (a unit kept gathered waits for nothing)
            if group.pending_all_gathers:  # issued beside compute: compute waits from here
                mark = timer.clock.mark()
                for marks in group.pending_all_gathers:
                    marks.waited_from = mark
                group.pending_all_gathers.clear()
            return wait_for_unshard(*args, **kwargs)

        def timed_post_backward(*args, **kwargs):
            timer = holder[0]
            if timer.pace is not None:
                timer.pace()
            if timer.stream_ordered and timer.timed:
                # compute stream: this group's gradients are computed; FSDP makes compute wait
                # here for the oldest reduce-scatters beyond its in-flight cap
                mark = timer.clock.mark()
                group.gradients_ready = mark
                pending = timer._pending_reduce_scatters
                while len(pending) >= timer._in_flight:
                    pending.pop(0).waited_from = mark
            return post_backward(*args, **kwargs)

        holder[1:3] = [timed_wait_for_unshard, timed_post_backward]
        param_group.wait_for_unshard = timed_wait_for_unshard
        param_group.post_backward = timed_post_backward
        return holder

    def set_timed(self, timed: bool) -> None:
        """Time the collectives from the next on, or not. Untimed, FSDP's own objects and methods go back in
        place of the timed ones (an attribute each per parameter group, only when the choice changes), so an
        untimed step runs no Python of the instrument's per collective; with a ground-truth delay to hold,
        the timed ones stay, calling through unmarked."""
        if timed == self.timed:
            return
        self.timed = timed
        if self.inject_delay_s or self.pace is not None:
            return
        for param_group, all_gather, reduce_scatter, holder in self._installed:
            param_group._all_gather_comm = all_gather if timed else all_gather.inner
            param_group._reduce_scatter_comm = reduce_scatter if timed else reduce_scatter.inner
            param_group.wait_for_unshard = holder[1] if timed else holder[3]
            param_group.post_backward = holder[2] if timed else holder[4]

    def _on_forward(self, module, args) -> None:
        self._training_forward = module.training and torch.is_grad_enabled()

    def _recording(self, backward: bool) -> bool:
        return backward or self._training_forward

    def _delay(self, marks: BucketMarks | None) -> None:
        """The ground truth's delay, inside the collective's call (module docstring); `marks` None: an
        untimed step's."""
        before = self.clock.mark() if marks is not None else None
        if self.clock.cuda:
            torch.cuda._sleep(self.spin_cycles)  # device work on the collective's stream
        else:
            time.sleep(self.inject_delay_s)
        if marks is not None:
            marks.injected = (before, self.clock.mark())

    def _holds_parameters(self, backward: bool) -> bool:
        """Whether this synchronous all-gather gets the "parameters" delay: the first of a training forward."""
        return (
            bool(self.inject_delay_s)
            and self.inject_into == "parameters"
            and not backward
            and not self._parameters_injected
        )

    def _holds_gradients(self, comm: TimedReduceScatter) -> bool:
        """Whether this synchronous reduce-scatter gets the "gradients" delay: the last one of a backward."""
        return (
            bool(self.inject_delay_s)
            and self.inject_into == "gradients"
            and comm.group.label == self._last_reduce_scatter
        )

    def all_gather(self, comm: TimedAllGather, output_tensor, input_tensor, group, async_op):
        if not self.timed:
            work = comm.inner(output_tensor, input_tensor, group, async_op)
            if (
                work is None
                and self.inject_delay_s
                and self._training_forward
                and self._holds_parameters(_in_backward())
            ):
                self._parameters_injected = True
                self._delay(None)
            return work
        entered = time.perf_counter()
        backward = _in_backward()
        if not self._recording(backward):
            return comm.inner(output_tensor, input_tensor, group, async_op)
        clock = self.clock
        if self.rule.ranks is None:
            self.rule.ranks = group.size()
        marks = BucketMarks(
            index=len(self._marks),
            handed_over=clock.mark(),
            kind="all_gather",
            nbytes=output_tensor.numel() * output_tensor.element_size(),
            module=comm.group.label,
            backward=backward,
        )
        self._marks.append(marks)
        called = time.perf_counter()
        work = comm.inner(output_tensor, input_tensor, group, async_op)
        if work is None:  # synchronous: done when the call returns
            if self._holds_parameters(backward):
                self._parameters_injected = True
                self._delay(marks)
            marks.completed = clock.mark()
            returned = time.perf_counter()
            if not self.stream_ordered:
                marks.waited_from = marks.handed_over  # the training thread waited in the call
                self.host_s += called - entered + time.perf_counter() - returned
                return None
        else:
            returned = time.perf_counter()
            self._observe_completion(marks, work)
        comm.group.pending_all_gathers.append(marks)
        self._waiting_groups.append(comm.group)
        self.host_s += called - entered + time.perf_counter() - returned
        return work

    def _observe_completion(self, marks: BucketMarks, work) -> None:
        """An asynchronous collective: its end is marked when its Work's future completes."""
        clock = self.clock

        def done(future):
            marks.completed = clock.mark()

        try:
            work.get_future().then(done)
        except RuntimeError:  # a Work without a future: its end is unknown
            marks.completion_known = False

    def reduce_scatter(self, comm: TimedReduceScatter, output_tensor, input_tensor, group, op, async_op):
        if not self.timed:
            work = comm.inner(output_tensor, input_tensor, group, op, async_op)
            if work is None and self._holds_gradients(comm):
                self._delay(None)
            return work
        entered = time.perf_counter()
        clock = self.clock
        if self.rule.ranks is None:
            self.rule.ranks = group.size()
        marks = BucketMarks(
            index=len(self._marks),
            handed_over=clock.mark(),
            kind="reduce_scatter",
            nbytes=input_tensor.numel() * input_tensor.element_size(),
            module=comm.group.label,
            backward=True,
        )
        self._marks.append(marks)
        norms = self._norms_before(input_tensor, group, op)
        called = time.perf_counter()
        work = comm.inner(output_tensor, input_tensor, group, op, async_op)
        returned = time.perf_counter()
        if work is not None:  # completes later, out of sight: no norms (the step keeps none)
            if norms is not None:
                self._norms.append([norms, None])
            self._observe_completion(marks, work)
            marks.waited_from = comm.group.gradients_ready if self.stream_ordered else None
            self.host_s += called - entered + time.perf_counter() - returned
            return work
        if self._holds_gradients(comm):
            self._delay(marks)
            returned = time.perf_counter()
        marks.completed = clock.mark()
        if norms is not None:  # on the call's stream, behind the reduce-scatter (FSDP's stream on a GPU)
            self._norms.append([norms, squared_norm(output_tensor)])
        if self.stream_ordered:
            # compute waits for it at a later post-backward, or at the end of backward from its
            # own gradients' readiness (module docstring)
            marks.waited_from = comm.group.gradients_ready
            self._pending_reduce_scatters.append(marks)
        else:
            marks.waited_from = marks.handed_over  # the training thread waited in the call
        self.host_s += called - entered + time.perf_counter() - returned
        return None

    def _norms_before(self, input_tensor, group, op):
        """The reduce-scatter input's squared norm where the noise scale can read this one: norms on, and the
        output the plain average over every rank of the job (ReduceOp.AVG, FSDP2's for fp32 and bf16 gradients;
        not fp16's divided input, a PREMUL_SUM factor of the user's, or HSDP's shard group); else None."""
        if not self.norms or op != dist.ReduceOp.AVG or group.size() != dist.get_world_size():
            return None
        return squared_norm(input_tensor)

    def take_norms(self) -> tuple[list, list, float] | None:
        """The reduce-scatters' squared norms since the last call, ([before ...], [after ...], 1.0) as the DDP
        timer's (timing.py), the after ones this rank's shards; None where none were taken."""
        taken, self._norms = self._norms, []
        if not taken:
            return None
        return [before for before, _ in taken], [after for _, after in taken], 1.0

    def take(self) -> list[BucketMarks]:
        """The collectives since the last take (one micro-batch's), in issue order."""
        taken, self._marks = self._marks, []
        self._pending_reduce_scatters = []
        for group in self._waiting_groups:
            group.pending_all_gathers.clear()
        self._waiting_groups = []
        self._parameters_injected = False
        for marks in reversed(taken):
            if marks.kind == "reduce_scatter":
                self._last_reduce_scatter = marks.module
                break
        return taken


class ShardedCommRule(CommRule):
    """The figures of a step's all-gathers and reduce-scatters (module docstring)."""

    per_collective = True

    def __init__(self, ranks: int | None = None):
        self.ranks = ranks  # the ranks of the collectives' group: set from the first collective's

    @property
    def bus_factor(self) -> float:
        """nccl-tests' busbw / algbw for all-gather and reduce-scatter: (n-1)/n."""
        n = self.ranks or 1
        return (n - 1) / n

    def synchronised(self, buckets: list) -> bool:
        return any(b.kind == "reduce_scatter" for b in buckets)

    def step_columns(self, micro_buckets: list, since_start) -> dict:
        nan = float("nan")
        in_flight = {kind: [] for kind in KINDS}
        regathers: list[tuple[float, float]] = []
        waits = {kind: [] for kind in KINDS}
        forward_waits: list[tuple[float, float]] = []  # the forward all-gathers' waits: inside forward_s
        seconds = dict.fromkeys(KINDS, 0.0)
        nbytes = dict.fromkeys((*KINDS, REGATHER), 0)
        counts = dict.fromkeys((*KINDS, REGATHER), 0)
        points, comm_span_s = [], 0.0
        compute_end = comm_end = nan
        count = 0
        for buckets in micro_buckets:
            first = last = None
            for b in buckets:
                count += 1
                issued = since_start(b.handed_over)
                done = since_start(b.completed) if (b.completed is not None and b.completion_known) else None
                waited = 0.0
                counts[b.kind] += 1
                nbytes[b.kind] += b.nbytes
                if b.kind == "all_gather" and b.backward:
                    counts[REGATHER] += 1
                    nbytes[REGATHER] += b.nbytes
                if b.kind == "reduce_scatter":
                    compute_end = issued
                if done is not None:
                    in_flight[b.kind].append((issued, done))
                    seconds[b.kind] += done - issued
                    if b.kind == "all_gather" and b.backward:
                        regathers.append((issued, done))
                    if b.waited_from is not None:
                        begin = since_start(b.waited_from)
                        if done > begin:
                            waits[b.kind].append((begin, done))
                            if not b.backward:
                                forward_waits.append((begin, done))
                            waited = done - begin
                    first = issued if first is None else min(first, issued)
                    last = done if last is None else max(last, done)
                points.append((issued, waited))
            if first is not None:
                comm_span_s += last - first
                comm_end = last
        factor = self.bus_factor
        columns = {
            "allreduce_s": nan,
            "exposed_comm_s": interval_union_s(waits["all_gather"] + waits["reduce_scatter"]),
            "exposed_forward_comm_s": interval_union_s(forward_waits),
            "comm_span_s": comm_span_s,
            "num_buckets": count,
            "compute_end": compute_end,
            "comm_end": comm_end,
            "comm_s": interval_union_s(in_flight["all_gather"] + in_flight["reduce_scatter"]),
        }
        for kind in KINDS:
            column = SHARDED_COLLECTIVES[kind]
            columns[f"{column}_s"] = interval_union_s(in_flight[kind])
            if kind == "all_gather":
                columns[f"{REGATHER}_s"] = interval_union_s(regathers)
            columns[f"exposed_{column}_s"] = interval_union_s(waits[kind])
            columns[f"{column}s"] = counts[kind]
            columns[f"{column}_bytes"] = nbytes[kind]
            if kind == "all_gather":
                columns[f"{REGATHER}s"], columns[f"{REGATHER}_bytes"] = counts[REGATHER], nbytes[REGATHER]
            columns[f"{column}_busbw_bytes_per_s"] = nbytes[kind] / seconds[kind] * factor if seconds[kind] > 0 else nan
        columns["sync_points"] = points
        return columns

    def collective_rows(self, marks, clock: Clock) -> list[dict]:
        """One row per collective: which, whose, when in the step, how long, how long compute waited."""
        rows = []
        factor = self.bus_factor
        for micro_batch, buckets in enumerate(marks.micro_buckets):
            for b in buckets:
                issued = clock.seconds(marks.start, b.handed_over)
                known = b.completed is not None and b.completion_known
                duration = clock.seconds(b.handed_over, b.completed) if known else float("nan")
                waited = 0.0
                if known and b.waited_from is not None:
                    waited = max(0.0, clock.seconds(b.waited_from, b.completed))
                rows.append(
                    {
                        "epoch": marks.epoch,
                        "step": marks.step,
                        "step_kind": marks.kind,
                        "warmup": marks.warmup,
                        "pair": marks.pair,
                        "micro_batch": micro_batch,
                        "index": b.index,
                        "collective": b.kind,
                        "module": b.module,
                        "pass": "backward" if b.backward else "forward",
                        "bytes": b.nbytes,
                        "start_s": issued,
                        "duration_s": duration,
                        "waited_s": waited,
                        "busbw_bytes_per_s": b.nbytes / duration * factor if duration > 0 else float("nan"),
                        "injected_s": clock.seconds(*b.injected) if b.injected is not None else 0.0,
                    }
                )
        return rows
