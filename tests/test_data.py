"""Datasets: the embedded one is deterministic and learnable-shaped; shards are disjoint."""

import torch

from scaling.config import DataConfig
from scaling.data import load_dataset, steps_per_epoch, train_shard, val_shard
from scaling.data.embedded import make_embedded


def test_embedded_is_deterministic_per_seed():
    a = make_embedded(3, 10, 32, 256, 64, 1.0)
    b = make_embedded(3, 10, 32, 256, 64, 1.0)
    c = make_embedded(4, 10, 32, 256, 64, 1.0)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], c[0])


def test_embedded_shapes_and_classes():
    train_x, train_y, val_x, val_y = make_embedded(0, 10, 32, 512, 128, 1.0)
    assert train_x.shape == (512, 3, 32, 32) and train_x.dtype == torch.float32
    assert val_x.shape == (128, 3, 32, 32)
    assert set(train_y.tolist()) == set(range(10))
    # the validation split is held out: different images, not a copy of the training set
    assert not any(torch.equal(val_x[0], img) for img in train_x)


def test_synthetic_has_no_validation():
    data = load_dataset(DataConfig(name="synthetic", train_samples=64), torch.device("cpu"))
    assert not data.has_validation and data.train_x.shape == (64, 3, 32, 32)


def test_train_shards_are_disjoint_equal_and_reshuffled():
    n, world = 1000, 3
    shards = [train_shard(n, rank, world, epoch=1, seed=0) for rank in range(world)]
    flat = [i for shard in shards for i in shard]
    assert len(flat) == len(set(flat)), "a sample is seen twice in one epoch"
    assert {len(s) for s in shards} == {n // world}
    assert train_shard(n, 0, world, epoch=2, seed=0) != shards[0]
    assert steps_per_epoch(n, world, 64) == (n // world) // 64


def test_val_shards_cover_everything_once():
    n, world = 1001, 4
    covered = sorted(i for rank in range(world) for i in val_shard(n, rank, world))
    assert covered == list(range(n))
