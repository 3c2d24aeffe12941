"""Scaling projection: the step time of synchronous data-parallel training (DDP, Horovod, FSDP) on a cluster
the lab has not run on, from one worker's compute time, the model's gradient buckets and when
backward makes them ready, and an alpha-beta model of the cluster's all-reduce.

    from scaling.projection import ProjectionSpec
    from scaling.projection.project import project  # the module's name: the package does not re-export it
    df = project(ProjectionSpec("resnet50", "p3.16xlarge", nodes=[1, 2, 4, 8, 16], per_gpu_batch=64, precision="fp32"))
    # run_projection("resnet50", "p3.16xlarge", nodes=[...]) is the same with the spec's fields as arguments

Pure Python: pandas, numpy, PyYAML; no torch or ray on import, and nothing of the lab's command
line, launchers, records or figures: a run's records come in as its reader (scaling.results.RunDir),
`scaling project` is wired in scaling/cli.py and the figure drawn by scaling/plots/projection.py.

- layers.py   layer tables (layers/*.json; a transformer's with FSDP units), each loaded once
- cost.py     alpha-beta costs (ring, hierarchical, NCCL's latency split), the overlapped bucket schedule with
              compute interference, Horovod's cycles and Tensor Fusion, FSDP's and HSDP's all-gathers and
              reduce-scatters per unit, fit_alpha_beta
- cluster.py  cluster presets (presets/*.yaml); a projection's rows placed on its nodes
- compute.py  one worker's step (data, forward, backward, optimizer) from a run, a device's published throughput
              (scaling/devices.yaml), or a transformer's MFU; the wait for the slowest rank: the compute stage
- spec.py     ProjectionSpec: what a projection is asked, a field (its meaning, default, checks and
              `scaling project` flag) per option; the command's flags are generated from it
- project.py  project(spec): the spec's names resolved once (`spec.Resolved`), then the stages below in
              turn, none calling back; run_projection (the spec's fields as arguments),
              project_cluster_from_alpha_beta
- buckets.py  DDP's bucket assignment and the buckets' ready fractions, Horovod's tensors: the gradients stage
- comm.py     one class per backend's communication computing a row's step: DDPComm, HorovodComm, FSDPComm
              (FSDP and HSDP); the communication stage
- memory.py   memory per GPU of a transformer: states, activations, FSDP's buffers, the runtime's reserve
- rows.py     the table: a row per worker count, the speedups and epochs (definitions of every column)
- tta.py      time to accuracy: epochs to target from measured points and the samples-to-target model
- from_run.py run_spec: the spec a user's own measured run (its records) asks; project_run: it projected,
              with intervals from its steps
- overlay.py  project_sweep, add_projection: projected columns for `scaling report` (a sweep with workers.cluster)
- make_layer_tables.py  regenerates layers/*.json (needs torch and the instrument's FLOP counting; never
              imported by the package)
- llama.py    Llama 3.1 8B's shape as a torch module, for make_layer_tables.py only (meta device)
"""

from scaling.projection.cluster import Cluster, cluster_from_alpha_beta, load_cluster, preset_names
from scaling.projection.cost import (
    AlphaBeta,
    Link,
    allreduce_s,
    fit_alpha_beta,
    horovod_schedule,
    overlap_schedule,
    ring_allreduce_s,
    schedule_buckets,
)
from scaling.projection.buckets import model_buckets
from scaling.projection.layers import available_models
from scaling.projection.project import project_cluster_from_alpha_beta, run_projection
from scaling.projection.spec import ProjectionSpec

__all__ = [
    "AlphaBeta",
    "Cluster",
    "Link",
    "ProjectionSpec",
    "allreduce_s",
    "available_models",
    "cluster_from_alpha_beta",
    "fit_alpha_beta",
    "horovod_schedule",
    "load_cluster",
    "model_buckets",
    "overlap_schedule",
    "preset_names",
    "project_cluster_from_alpha_beta",
    "ring_allreduce_s",
    "run_projection",
    "schedule_buckets",
]
