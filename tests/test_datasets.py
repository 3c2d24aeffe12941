"""CIFAR-10 and ImageNet-folder loaders on tiny generated datasets: shapes, labels, sharding,
augmentation, and the one-line refusals of a missing, empty or malformed dataset."""

import pickle

import numpy as np
import pytest
import torch

from scaling.config import DataConfig, load_config
from scaling.data import check_dataset, load_dataset
from scaling.data.cifar10 import augment_pad_crop_flip
from scaling.data.errors import DatasetError
from scaling.data.fake import make_cifar10, make_image_folder
from scaling.data.imagefolder import random_resized_crop_box
from scaling.errors import UsageError

CPU = torch.device("cpu")
QUICKSTART = "experiments/quickstart.yaml"


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    return make_cifar10(tmp_path_factory.mktemp("cifar") / "cifar-10-batches-py", per_batch=40)


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("imagenet"), classes=6, per_class=5, val_per_class=3)


def cifar_cfg(path, **kw):
    return DataConfig(name="cifar10", path=str(path), num_classes=10, image_size=32, **kw)


def imagenet_cfg(path, num_classes=6, **kw):
    return DataConfig(name="imagenet", path=str(path), num_classes=num_classes, image_size=64, loader_workers=0, **kw)


def test_cifar10_shapes_labels_and_disjoint_shards(cifar_dir):
    assert check_dataset(cifar_cfg(cifar_dir)) == {"train": 200, "val": 40}
    data = load_dataset(cifar_cfg(cifar_dir), CPU)
    assert data.num_train == 200 and data.has_validation
    seen = []
    for rank in range(2):
        batches = list(data.train_batches(rank, 2, epoch=1, seed=0, batch_size=16))
        assert len(batches) == 100 // 16
        for x, y in batches:
            assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
            assert 0 <= int(y.min()) and int(y.max()) < 10
        seen.append({tuple(x.flatten()[:8].tolist()) for x, _ in batches})
    val = list(data.val_batches(0, 1, 512))
    assert sum(len(y) for _, y in val) == 40
    # normalised: roughly zero-mean, unit-scale inputs (not 0..255)
    assert abs(float(val[0][0].mean())) < 1.5 and float(val[0][0].abs().max()) < 4


def test_cifar10_augmentation_is_a_shifted_or_flipped_copy():
    images = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).view(2, 3, 32, 32)
    out = augment_pad_crop_flip(images, torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    for original, augmented in zip(images, out):
        # every output pixel is an input pixel or zero padding; a crop keeps most of the image
        assert set(augmented.unique().tolist()) <= set(original.unique().tolist()) | {0.0}
        assert (augmented != 0).float().mean() >= (24 / 32) ** 2


def test_imagenet_folder_shapes_labels_top5_and_shards(imagenet_dir):
    assert check_dataset(imagenet_cfg(imagenet_dir)) == {"train": 30, "val": 18, "classes": 6}
    data = load_dataset(imagenet_cfg(imagenet_dir), CPU)
    shard_labels = []
    for rank in range(2):
        batches = list(data.train_batches(rank, 2, epoch=1, seed=0, batch_size=4))
        assert len(batches) == 15 // 4
        for x, y in batches:
            assert x.shape == (4, 3, 64, 64) and x.dtype == torch.float32
        shard_labels.append(torch.cat([y for _, y in batches]))
    val = [(x, y) for rank in range(2) for x, y in data.val_batches(rank, 2, 5)]
    assert sum(len(y) for _, y in val) == 18
    assert sorted(torch.cat([y for _, y in val]).tolist()) == sorted([c for c in range(6) for _ in range(3)])


def test_imagenet_folder_with_loader_workers(imagenet_dir):
    data = load_dataset(imagenet_cfg(imagenet_dir), CPU, loader_workers=2)
    x, y = next(iter(data.train_batches(0, 1, epoch=1, seed=0, batch_size=8)))
    assert x.shape == (8, 3, 64, 64)


def test_random_resized_crop_stays_inside_and_in_ratio():
    import random

    rng = random.Random(0)
    for width, height in [(500, 375), (64, 64), (1000, 100)]:
        for _ in range(200):
            left, top, right, bottom = random_resized_crop_box(width, height, rng)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height


@pytest.mark.parametrize("make_bad, message", [
    (lambda root: root / "absent", "does not exist"),
    (lambda root: (root / "empty").mkdir() or root / "empty", "has no 'train' folder"),
    (lambda root: (root / "noclass" / "train").mkdir(parents=True) or root / "noclass", "holds no class folders"),
])
def test_imagenet_missing_or_empty_refused(tmp_path, make_bad, message):
    with pytest.raises(DatasetError, match=message):
        check_dataset(imagenet_cfg(make_bad(tmp_path)))


def test_imagenet_unreadable_image_refused(tmp_path):
    root = make_image_folder(tmp_path / "bad", classes=3, per_class=2, val_per_class=1)
    victim = sorted((root / "train" / "n00000001").iterdir())[0]
    victim.write_bytes(b"this is not a jpeg")
    with pytest.raises(DatasetError, match=f"unreadable image .*{victim.name}"):
        check_dataset(imagenet_cfg(root, num_classes=3))


def test_imagenet_class_mismatch_and_wrong_num_classes_refused(tmp_path):
    root = make_image_folder(tmp_path / "mismatch", classes=3, per_class=2, val_per_class=1)
    with pytest.raises(DatasetError, match="set data.num_classes: 3"):
        check_dataset(imagenet_cfg(root, num_classes=1000))
    for image in (root / "val" / "n00000002").iterdir():
        image.unlink()
    (root / "val" / "n00000002").rmdir()
    with pytest.raises(DatasetError, match="must be the same"):
        check_dataset(imagenet_cfg(root, num_classes=3))


def test_cifar10_missing_batch_and_wrong_shape_refused(tmp_path):
    root = make_cifar10(tmp_path / "c", per_batch=10)
    (root / "data_batch_3").unlink()
    with pytest.raises(DatasetError, match="data_batch_3 is missing"):
        check_dataset(cifar_cfg(root))
    with (root / "data_batch_3").open("wb") as handle:
        pickle.dump({b"data": np.zeros((10, 1024), np.uint8), b"labels": [0] * 10}, handle)
    with pytest.raises(DatasetError, match="N x 3072 uint8"):
        check_dataset(cifar_cfg(root))
    (root / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(DatasetError, match="not a CIFAR-10 python batch"):
        check_dataset(cifar_cfg(root))


def test_dataset_problems_surface_as_config_errors_before_any_worker(tmp_path):
    # load_config is what `scaling run` calls first; a DatasetError is a UsageError (exit 2).
    with pytest.raises(DatasetError, match="does not exist"):
        load_config(QUICKSTART, overrides=["data.name=cifar10", f"data.path={tmp_path / 'nope'}"])
    with pytest.raises(UsageError, match="needs data.path"):
        load_config(QUICKSTART, overrides=["data.name=cifar10"])


@pytest.mark.parametrize("config, fake", [
    ("experiments/resnet50-imagenet-p3.yaml", "imagenet"),
    ("experiments/amoebanet-d-imagenet-p3.yaml", "imagenet"),
    ("experiments/resnet56-cifar10.yaml", "cifar10"),
])
def test_experiment_configs_load_against_a_dataset_in_their_format(config, fake, cifar_dir, imagenet_dir):
    # The real datasets are not here; the same keys must validate against a tiny one.
    overrides = [f"data.path={cifar_dir}"] if fake == "cifar10" else [f"data.path={imagenet_dir}", "data.num_classes=6"]
    cfg = load_config(config, overrides=overrides + ["train.per_worker_batch=2"], num_workers=2)
    assert cfg.workers.use_gpu and cfg.data.name == fake
