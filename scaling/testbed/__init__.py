"""The test-bed: this machine as a cluster, for proofs rather than for users' runs.

- local_cluster.py    a free loopback port, a private Ray head (loopback, its own temp dir, stopped by pid)
- minicluster.py      a multi-node Ray cluster in network namespaces, links capped with tc (`scaling minicluster`)
- allreduce_probe.py  one rank of a gloo all-reduce timing between minicluster nodes

The tests, the benchmarks and the launchers use it (a run may re-cap the minicluster's links:
`workers.link_bandwidth`); the instrument never does.
"""
