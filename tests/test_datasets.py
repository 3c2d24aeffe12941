"""CIFAR-10 and ImageNet-folder loaders on tiny generated datasets: shapes, labels, sharding,
augmentation, and the one-line refusals of a missing, empty or malformed dataset.

Sharding and labels are checked on datasets whose every image is one flat colour that encodes
its identity (a flat image stays flat through crop, flip and resize, and zero padding is darker),
so each batch says which images it holds: the ranks' shards are disjoint, cover the epoch,
and every label is the one written with its image, with and without DataLoader workers."""

import math
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from scaling.config import DataConfig, load_config
from scaling.data import cifar10, check_dataset, imagefolder, load_dataset
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


# ---------------------------------------------------------------------------- datasets that name their images


def _red_levels(x: torch.Tensor, mean: tuple, std: tuple) -> torch.Tensor:
    """The 0..255 red level of every pixel of a normalised NCHW batch (normalisation undone)."""
    return ((x[:, 0] * std[0] + mean[0]) * 255).round()


def _cifar_with_ids(root) -> Path:
    """CIFAR-10 batches of flat images: training image i (0..199) is level i + 1 in every channel,
    labelled i % 10; validation image j (0..39) is level 201 + j, labelled j % 10."""
    root.mkdir(parents=True)
    for b, name in enumerate([*cifar10.TRAIN_BATCHES, cifar10.TEST_BATCH]):
        first = 40 * b  # 5 training batches of 40 (ids 0..199), then the 40 validation images
        ids = np.arange(first, first + 40)
        data = np.repeat((ids + 1).astype(np.uint8)[:, None], 3072, axis=1)
        with (root / name).open("wb") as handle:
            pickle.dump({b"data": data, b"labels": [int(i % 10) for i in ids]}, handle)
    return root


def _cifar_ids(x: torch.Tensor) -> list[int]:
    # a crop keeps at least 24 x 24 of the 32 x 32 image; the rest is zero padding (level 0)
    return [int(level) - 1 for level in _red_levels(x, cifar10.MEAN, cifar10.STD).flatten(1).max(dim=1).values]


def _folder_with_ids(root, classes: int, per_class: int, val_per_class: int) -> tuple[Path, dict[int, int]]:
    """An image folder of flat PNGs (lossless) of varied sizes: image k has red level 10 (k + 1);
    returns the folder and {k: the class folder it was written to}."""
    label_of, k = {}, 0
    for split, count in (("train", per_class), ("val", val_per_class)):
        for label in range(classes):
            folder = root / split / f"n{label:08d}"
            folder.mkdir(parents=True)
            for index in range(count):
                size = (48 + 7 * k % 50, 40 + 11 * k % 60)
                Image.new("RGB", size, (10 * (k + 1), 40 * label + 20, 7)).save(folder / f"{index:03d}.png")
                label_of[k], k = label, k + 1
    return root, label_of


def _folder_ids(x: torch.Tensor) -> list[int]:
    levels = _red_levels(x, imagefolder.MEAN, imagefolder.STD).flatten(1)
    assert (levels == levels[:, :1]).all()  # still flat after crop, flip and resize
    return [int(level) // 10 - 1 for level in levels[:, 0]]


def test_cifar10_shapes_and_labels(cifar_dir):
    assert check_dataset(cifar_cfg(cifar_dir)) == {"train": 200, "val": 40}
    data = load_dataset(cifar_cfg(cifar_dir), CPU)
    assert data.num_train == 200 and data.has_validation
    for rank in range(2):
        batches = list(data.train_batches(rank, 2, epoch=1, seed=0, batch_size=16))
        assert len(batches) == 100 // 16
        for x, y in batches:
            assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
            assert 0 <= int(y.min()) and int(y.max()) < 10
    val = list(data.val_batches(0, 1, 512))
    assert sum(len(y) for _, y in val) == 40
    # normalised: roughly zero-mean, unit-scale inputs (not 0..255)
    assert abs(float(val[0][0].mean())) < 1.5 and float(val[0][0].abs().max()) < 4


def test_cifar10_shards_are_disjoint_and_labels_stay_with_their_images(tmp_path):
    data = load_dataset(cifar_cfg(_cifar_with_ids(tmp_path / "ids")), CPU)
    orders = []
    for epoch in (1, 2):
        shards = []
        for rank in range(2):
            ids = []
            for x, y in data.train_batches(rank, 2, epoch=epoch, seed=0, batch_size=16):
                batch = _cifar_ids(x)
                assert y.tolist() == [i % 10 for i in batch]  # the label written with that image
                ids += batch
            # 200 images / 2 ranks = 100 each: 6 full batches of 16 (the last 4 are dropped)
            assert len(ids) == 96 == len(set(ids)) and set(ids) <= set(range(200))
            shards.append(ids)
        assert not set(shards[0]) & set(shards[1])  # no image on both ranks in one epoch
        orders.append(shards[0])
    assert orders[0] != orders[1]  # a new permutation each epoch
    # validation: each of the 40 images exactly once across the ranks, with its label
    val = [
        (i, int(label))
        for rank in range(2)
        for x, y in data.val_batches(rank, 2, 16)
        for i, label in zip(_cifar_ids(x), y)
    ]
    assert sorted(val) == [(200 + j, j % 10) for j in range(40)]


def test_cifar10_augmentation_is_a_shifted_or_flipped_copy():
    images = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).view(2, 3, 32, 32)
    out = augment_pad_crop_flip(images, torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    for original, augmented in zip(images, out):
        # every output pixel is an input pixel or zero padding; a crop keeps most of the image
        assert set(augmented.unique().tolist()) <= set(original.unique().tolist()) | {0.0}
        assert (augmented != 0).float().mean() >= (24 / 32) ** 2


class _ConstantLogits(torch.nn.Module):
    """Scores classes 0..5 as 0, 1, 5, 4, 3, 2 for every image: ranked 2, 3, 4, 5, 1, 0."""

    def forward(self, x):
        return torch.tensor([0.0, 1.0, 5.0, 4.0, 3.0, 2.0]).expand(len(x), 6)


def test_imagenet_folder_shapes_and_top5(imagenet_dir):
    from scaling.train.loop import WorkerContext, _evaluate
    from scaling.train.precision import Precision

    assert check_dataset(imagenet_cfg(imagenet_dir)) == {"train": 30, "val": 18, "classes": 6}
    data = load_dataset(imagenet_cfg(imagenet_dir), CPU)
    for rank in range(2):
        batches = list(data.train_batches(rank, 2, epoch=1, seed=0, batch_size=4))
        assert len(batches) == 15 // 4
        for x, y in batches:
            assert x.shape == (4, 3, 64, 64) and x.dtype == torch.float32
            assert 0 <= int(y.min()) and int(y.max()) < 6
    val = [(x, y) for rank in range(2) for x, y in data.val_batches(rank, 2, 5)]
    assert sum(len(y) for _, y in val) == 18
    assert sorted(torch.cat([y for _, y in val]).tolist()) == sorted([c for c in range(6) for _ in range(3)])
    # The loop's top-1/top-5 over this validation set (3 images per class): the top class is 2,
    # so top-1 = 3/18; the top five are every class but 0, so top-5 = 15/18.
    ctx = WorkerContext(rank=0, world_size=1, local_rank=0, node_rank=0, device=CPU)
    accuracy = _evaluate(_ConstantLogits(), data, ctx, Precision("fp32", False, CPU))
    # and the loss: the mean over the classes (3 images each) of logsumexp(scores) - the true class's score
    scores = torch.tensor([0.0, 1.0, 5.0, 4.0, 3.0, 2.0])
    loss = float((torch.logsumexp(scores, 0) - scores).mean())
    assert accuracy == {"top1": pytest.approx(3 / 18), "top5": pytest.approx(15 / 18), "loss": pytest.approx(loss)}


def test_imagenet_folder_shards_and_labels(tmp_path):
    root, label_of = _folder_with_ids(tmp_path / "ids", classes=3, per_class=4, val_per_class=2)
    data = load_dataset(imagenet_cfg(root, num_classes=3), CPU)
    assert data.num_train == 12
    shards = []
    for rank in range(2):
        ids = []
        for x, y in data.train_batches(rank, 2, epoch=1, seed=0, batch_size=3):
            batch = _folder_ids(x)
            assert y.tolist() == [label_of[k] for k in batch]  # the class folder it was written to
            ids += batch
        shards.append(ids)
    # 12 images / 2 ranks = 6 each, 2 batches of 3: together, every training image (0..11) exactly once
    assert len(shards[0]) == len(shards[1]) == 6
    assert sorted(shards[0] + shards[1]) == list(range(12))
    # validation (images 12..17): each exactly once across the ranks, with its label
    val = [
        (k, int(label))
        for rank in range(2)
        for x, y in data.val_batches(rank, 2, 4)
        for k, label in zip(_folder_ids(x), y)
    ]
    assert sorted(val) == [(12 + j, j // 2) for j in range(6)]


@pytest.mark.slow  # DataLoader worker processes
def test_imagenet_folder_with_loader_workers(tmp_path, imagenet_dir):
    # Decoding in 2 DataLoader processes yields the same images, labels and order as in-process.
    root, label_of = _folder_with_ids(tmp_path / "ids", classes=3, per_class=4, val_per_class=2)
    in_process = load_dataset(imagenet_cfg(root, num_classes=3), CPU, loader_workers=0)
    workers = load_dataset(imagenet_cfg(root, num_classes=3), CPU, loader_workers=2)
    for rank in range(2):
        expected = [(_folder_ids(x), y.tolist()) for x, y in in_process.train_batches(rank, 2, 1, 0, 3)]
        got = [(_folder_ids(x), y.tolist()) for x, y in workers.train_batches(rank, 2, 1, 0, 3)]
        assert got == expected and len(got) == 2
        assert all(labels == [label_of[k] for k in ids] for ids, labels in got)
    val = [k for rank in range(2) for x, _ in workers.val_batches(rank, 2, 4) for k in _folder_ids(x)]
    assert sorted(val) == list(range(12, 18))
    # In worker processes the random crops and flips are seeded from (seed, rank, epoch): the
    # same epoch twice gives the same batches, another epoch other crops (on real, non-flat images).
    noisy = load_dataset(imagenet_cfg(imagenet_dir), CPU, loader_workers=2)
    first, again, other = ([x for x, _ in noisy.train_batches(0, 1, epoch, 0, 10)] for epoch in (1, 1, 2))
    assert len(first) == 3 and all(torch.equal(a, b) for a, b in zip(first, again))
    assert not any(torch.equal(a, b) for a, b in zip(first, other))


def test_random_resized_crop_scale_and_ratio():
    rng = random.Random(0)
    # the largest possible crop: the whole image where its aspect is in range (500 x 375 is 4:3);
    # for 96 x 48 (2:1) the widest crop that fits is 48 high, 48 x 4/3 = 64 wide: 64 x 48 / (96 x 48) = 2/3
    for width, height, largest in [(500, 375, 1.0), (64, 64, 1.0), (96, 48, 2 / 3)]:
        scales, ratios = [], []
        for _ in range(500):
            left, top, right, bottom = random_resized_crop_box(width, height, rng)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height
            w, h = right - left, bottom - top
            # w and h are rounded from sqrt(area x aspect) and sqrt(area / aspect), area in 8%..100%
            # of the image and aspect in 3/4..4/3: some real w', h' within 0.5 of them hit both ranges.
            assert (w - 0.5) * (h - 0.5) <= width * height and (w + 0.5) * (h + 0.5) >= 0.08 * width * height
            assert (w - 0.5) / (h + 0.5) <= 4 / 3 and (w + 0.5) / (h - 0.5) >= 3 / 4
            scales.append(w * h / (width * height))
            ratios.append(w / h)
        # the draws span the ranges (seeded: the same 500 draws on every machine)
        assert min(scales) < 0.12 and largest - 0.1 < max(scales) <= largest
        assert min(ratios) < 0.8 and max(ratios) > 1.25
        if width == height:  # log-uniform aspect, accepted alike both ways on a square: centred on 1
            assert abs(sum(math.log(r) for r in ratios) / len(ratios)) < 0.05
    # No try can fit: 10 tries of at least 8% of the area need h >= sqrt(0.08 x 10,000 / (4/3)) = 24.5 > 10.
    # The fallback is the centre crop with the aspect clamped: 1000 x 10 -> w = round(10 x 4/3) = 13,
    # left = (1000 - 13) // 2 = 493; and 10 x 1000 -> h = round(10 / (3/4)) = 13, top = 493.
    assert random_resized_crop_box(1000, 10, rng) == (493, 0, 506, 10)
    assert random_resized_crop_box(10, 1000, rng) == (0, 493, 10, 506)


@pytest.mark.parametrize(
    "make_bad, message",
    [
        (lambda root: root / "absent", "does not exist"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "has no 'train' folder"),
        (lambda root: (root / "noclass" / "train").mkdir(parents=True) or root / "noclass", "holds no class folders"),
    ],
)
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


def test_dataset_problems_surface_at_preflight_before_any_worker(tmp_path):
    # The preflight is what `scaling run` runs before writing anything; a DatasetError is a UsageError (exit 2).
    from scaling.launch.preflight import preflight

    with pytest.raises(DatasetError, match="does not exist"):
        preflight(
            load_config(QUICKSTART, overrides=["data.name=cifar10", f"data.path={tmp_path / 'nope'}"]),
            "local",
            capacity=False,
        )
    with pytest.raises(UsageError, match="needs data.path"):
        preflight(load_config(QUICKSTART, overrides=["data.name=cifar10"]), "local", capacity=False)


@pytest.mark.parametrize(
    "config, fake",
    [
        ("experiments/resnet50-imagenet-p3.yaml", "imagenet"),
        ("experiments/amoebanet-d-imagenet-p3.yaml", "imagenet"),
        ("experiments/resnet56-cifar10.yaml", "cifar10"),
    ],
)
def test_experiment_configs_load_against_a_dataset_in_their_format(config, fake, cifar_dir, imagenet_dir):
    # The real datasets are not here; the same keys must validate against a tiny one.
    overrides = [f"data.path={cifar_dir}"] if fake == "cifar10" else [f"data.path={imagenet_dir}", "data.num_classes=6"]
    from scaling.launch.preflight import preflight

    cfg = load_config(config, overrides=overrides + ["train.per_worker_batch=2"], num_workers=2)
    preflight(cfg, "ray", capacity=False)  # the dataset read and counted, as before a run
    assert cfg.workers.use_gpu and cfg.data.name == fake
