"""Everything that runs a job: the preflight (every look at the world, before anything is
written), the launchers (Ray Train: ray_train.py; plain torch.distributed processes: local.py),
one run (run.py) and a sweep of them (sweep.py), what a launcher hands the instrument of the job
it runs (instrument_parts.py: Ray's identity and live metrics, live_metrics.py; the finish), and
the run's finish once its ranks stopped (finish.py: the summary, the trace and the exports, from
the records).
"""

# The launchers a run or sweep names (`scaling run --launcher`), each with what it starts; run.py dispatches on them.
LAUNCHERS = {
    "ray": "Ray Train on the current Ray cluster",
    "local": "torch.distributed processes on this host, no Ray",
}
