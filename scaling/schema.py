"""The record schema, declared once: the step columns the instrument writes and every reader reads.

The ground floor of the house (it imports nothing): the instrument writes these columns
(scaling/instrument/timing.py, the backends), and the analysis, the live metrics, the figures,
the report and the projection read them by these names. A new phase, collective kind or step
column is written here, once.

A step's time is cut into its phases, each a column `<phase>_s` (they add up to `step_s`). Each
collective kind is a column stem: its time in flight per step is `<kind>_s`, its share of the step
`<kind>_pct`; a sharded backend's kinds also have their exposed part, `exposed_<kind>_s`.
"""

from __future__ import annotations

# The DDP settings that make the wrapper itself work in every training step (job.json `per_step_settings`,
# the DDP backend's reading of the wrapper): the unused parameters searched for after each forward (and their
# map all-reduced), and the buffers broadcast from rank 0 before it. Their time is `wrapper_s`.
DDP_SETTINGS_WITH_WORK = ("find_unused_parameters", "sync_buffers")


def ddp_settings_with_work(settings: dict) -> list[str]:
    """The names of DDP_SETTINGS_WITH_WORK that `settings` (`per_step_settings`) turns on; a static graph
    spares the unused parameters' search (DDP finds them once)."""
    on = [name for name in DDP_SETTINGS_WITH_WORK if settings.get(name)]
    return [name for name in on if not (name == "find_unused_parameters" and settings.get("static_graph"))]


# A run's compute precision (summary.json `precision`, the config's train.precision): fp32, or autocast to fp16
# (with a GradScaler) or bf16
PRECISIONS = ("fp32", "fp16", "bf16")
# The arithmetic a device's datasheet gives a peak for (scaling/devices.yaml `peak_tflops_per_s`): the
# precisions, and TF32 (fp32 matmuls on tensor cores)
PEAK_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PHASES = ("data", "forward", "backward", "optimizer")  # a step's phases, in the order a step runs them
PHASE_COLUMNS = tuple(f"{phase}_s" for phase in PHASES)

# The collective kinds: the column stem of each and what it is, in words (the report's tables, the
# figures and a run's screen name each kind from here).
COLLECTIVE_KINDS = {
    "allreduce": "all-reduce",
    "allgather": "all-gather",
    "reducescatter": "reduce-scatter",
    "token_allgather": "token all-gather",
}
# A sharded backend's kinds (FSDP2: scaling/instrument/backends/fsdp.py), by the name FSDP2 gives
# the collective (its `_all_gather_comm`, `_reduce_scatter_comm`), each with its exposed part
# (`exposed_<kind>_s`), beside `comm_s` (any collective in flight).
SHARDED_COLLECTIVES = {"all_gather": "allgather", "reduce_scatter": "reducescatter"}
SHARDED_KINDS = tuple(SHARDED_COLLECTIVES.values())
REGATHER = "regather"  # backward's re-gathers of resharded parameters: a part of `allgather_s`
# Collectives a job runs beside its gradients', timed on the host by its integration on every step
# (StepMeter.record_job_collective): the HF Trainer's all-gather of the step's token count. Outside
# `allreduce_s` and `exposed_comm_s`, which are the gradients'.
JOB_KINDS = ("token_allgather",)
KIND_FIELDS = (
    "comm_s",
    *(f"{kind}_s" for kind in SHARDED_KINDS),
    f"{REGATHER}_s",
    *(f"exposed_{kind}_s" for kind in SHARDED_KINDS),
    "exposed_forward_comm_s",
    *(f"{kind}_s" for kind in JOB_KINDS),
)
# A step's timed figures (s, or counts of micro-batches): what a run's summary averages
STEP_FIELDS = PHASE_COLUMNS + (
    "step_s",
    "compute_s",
    "allreduce_s",
    "exposed_comm_s",
    "waiting_s",
    "transfer_s",
    "micro_batches",
    "synced_micro_batches",
    "instrument_host_s",
    "wrapper_s",
    *KIND_FIELDS,
)
# The step columns whose share of the step is a figure (`<name>` -> `<name minus _s>_pct`): each share
# is taken over the steps that recorded its numerator (run_metrics.StepAccumulator.share)
SHARE_FIELDS = ("allreduce_s", "exposed_comm_s", "waiting_s", "transfer_s", "wrapper_s", *KIND_FIELDS)
# The step-record columns a run's figures need (scaling.results.step_batches reads only these).
STEP_COLUMNS = [
    "kind", "warmup", "epoch", "step", "rank", "pair", "node_rank", "straggler_rank", "comm_span_s", *STEP_FIELDS,
]  # fmt: skip
# Per rank, over its steady-state steps ("who waits for whom": ranks.parquet, the report).
# Each rank's phases too: a straggler that waits for its input (data_s) and one that computes slower
# (forward_s, backward_s) are told apart here
RANK_FIELDS = ("step_s", *PHASE_COLUMNS, "exposed_comm_s", "waiting_s", "transfer_s", "comm_span_s")
# The gradient noise scale's inputs per step (scaling/noise_scale.py; NaN on the steps that took none): the
# gradient's squared norm at the rank's batch and at the global one, and the two batch sizes
NOISE_COLUMNS = ("grad_sq_small", "grad_sq_big", "noise_batch_small", "noise_batch_big")
# Per epoch (epochs.parquet, the ranks' steps pooled) and per run (summary.json, over the epochs): the noise scale with
# its 95% interval, its numerator and denominator, and what it rests on
NOISE_FIGURES = ("noise_scale", "noise_scale_low", "noise_scale_high", "grad_trace", "grad_sq", "noise_steps")
