"""Everything that runs a job: the preflight (every look at the world, before anything is
written), the launchers (Ray Train: ray_train.py; plain torch.distributed processes: local.py),
one run (run.py) and a sweep of them (sweep.py), the run's finish once its ranks stopped
(finish.py: the summary, the trace and the exports, from the records), and what the lab hands
the instrument (instrument_parts.py: Ray Train's identity, its live metrics in live_metrics.py,
and the finish, for a job it did not attach itself).
"""
