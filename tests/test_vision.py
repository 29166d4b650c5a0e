"""Image workloads: shapes, CIFAR-10 and ImageFolder from disk, torchvision models, and the two
data pipelines (per-sample DataLoader and batched on the device) giving the same augmentation."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from autotune.pipeline import CROP_PADDING, DeviceBatches, ImageTensorDataset, make_train_loader
from autotune.runner import train
from autotune.space import restrict
from autotune.spec import WorkloadSpec, parse_spec
from autotune.testing import CPU, make_config, never_stop
from autotune.workloads import WorkloadError, load
from autotune.workloads.vision import SHAPES, shapes

DEVICE = torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Data sets
# ---------------------------------------------------------------------------------------------


def test_shapes_are_deterministic_balanced_and_cifar_sized():
    train_set, val_set = shapes(n_train=200, n_val=50, seed=3)
    again, _ = shapes(n_train=200, n_val=50, seed=3)
    other, _ = shapes(n_train=200, n_val=50, seed=4)
    assert train_set.images.shape == (200, 3, 32, 32) and train_set.images.dtype == torch.uint8
    assert val_set.images.shape == (50, 3, 32, 32)
    assert torch.equal(train_set.images, again.images)
    assert not torch.equal(train_set.images, other.images)
    assert torch.bincount(train_set.labels, minlength=10).tolist() == [20] * 10
    assert train_set.classes == SHAPES and train_set.augment and not val_set.augment
    image, label = train_set[0]
    assert (
        image.shape == (3, 32, 32) and image.dtype == torch.float32 and label.dtype == torch.long
    )
    with pytest.raises(ValueError, match="difficulty"):
        shapes(n_train=10, n_val=10, difficulty=2)


def write_fake_cifar(root: Path, per_batch: int = 8) -> None:
    """CIFAR-10's on-disk format: pickled dicts of uint8 rows (N, 3072) and labels."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            "batch_label": name,
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": [int(v) for v in rng.integers(0, 10, per_batch)],
        }
        with open(folder / name, "wb") as stream:
            pickle.dump(entry, stream)


def test_cifar10_is_read_from_its_standard_format(tmp_path: Path):
    write_fake_cifar(tmp_path)
    workload = load(WorkloadSpec(model="mlp", data="cifar10", data_args={"root": str(tmp_path)}))
    assert len(workload.train_set) == 40 and len(workload.val_set) == 8
    assert workload.num_classes == 10 and workload.input_shape == (3, 32, 32)
    raw = pickle.loads((tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes())
    first = torch.from_numpy(raw["data"][0].reshape(3, 32, 32))
    assert torch.equal(workload.train_set.images[0], first)  # channels stay where CIFAR has them
    result = train(make_config(batch_size=8, epochs=1), workload, never_stop)
    assert 0 <= result.accuracy <= 1


def test_missing_cifar10_says_where_to_put_it(tmp_path: Path):
    with pytest.raises(WorkloadError) as caught:
        load(WorkloadSpec(model="mlp", data="cifar10", data_args={"root": str(tmp_path)}))
    message = str(caught.value)
    assert f"no CIFAR-10 at {tmp_path / 'cifar-10-batches-py'}" in message
    assert "extract it into" in message and "\n" not in message


def test_a_truncated_cifar10_batch_is_one_clear_error(tmp_path: Path):
    write_fake_cifar(tmp_path)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:100])  # an interrupted extraction
    with pytest.raises(WorkloadError) as caught:
        load(WorkloadSpec(model="mlp", data="cifar10", data_args={"root": str(tmp_path)}))
    message = str(caught.value)
    assert f"{batch} is not a readable CIFAR-10 batch" in message and "\n" not in message


def write_image_folder(root: Path, per_class: int = 4) -> None:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for index, name in enumerate(("cats", "dogs")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for k in range(per_class):
                pixels = rng.integers(0, 256, (20 + k, 24, 3), dtype=np.uint8)
                pixels[..., index] = 255  # a learnable colour cue per class
                Image.fromarray(pixels).save(folder / f"{k}.png")


def test_imagefolder_trains_one_epoch(tmp_path: Path):
    write_image_folder(tmp_path)
    spec = WorkloadSpec(model="mlp", data="imagefolder", data_args={"root": str(tmp_path)})
    workload = load(spec)
    assert workload.num_classes == 2 and workload.input_shape == (3, 32, 32)
    assert workload.train_set.classes == ("cats", "dogs")
    result = train(
        make_config(batch_size=4, epochs=1, num_workers=1, prefetch_factor=2), workload, never_stop
    )
    assert result.optimizer_steps == 2


def test_empty_or_missing_imagefolder_is_one_clear_error(tmp_path: Path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    for root, expected in [
        (tmp_path, "Couldn't find any class folder"),
        (tmp_path / "x", "no train folder"),
    ]:
        with pytest.raises(WorkloadError) as caught:
            load(WorkloadSpec(model="mlp", data="imagefolder", data_args={"root": str(root)}))
        assert expected in str(caught.value) and "\n" not in str(caught.value)


# ---------------------------------------------------------------------------------------------
# torchvision models
# ---------------------------------------------------------------------------------------------


def test_any_torchvision_model_by_name_with_a_cifar_stem():
    spec = WorkloadSpec(
        model="torchvision:resnet18",
        model_args={"cifar_stem": True},
        data="shapes",
        data_args={"n_train": 64, "n_val": 32},
    )
    workload = load(spec)
    model = workload.build_model()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert model.fc.out_features == 10  # num_classes from the data
    plain = load(spec.model_copy(update={"model_args": {}})).build_model()
    assert plain.conv1.kernel_size == (7, 7)
    result = train(make_config(batch_size=32, epochs=1), workload, never_stop)
    assert result.optimizer_steps == 2


@pytest.mark.parametrize(
    ("model", "args", "expected"),
    [
        ("torchvision:resnet1800", {}, "Unknown model resnet1800"),
        ("torchvision:resnet18", {"weights": "DEFAULT"}, "would be downloaded"),
        ("torchvision:mobilenet_v3_small", {"cifar_stem": True}, "ResNet-style"),
    ],
)
def test_torchvision_model_errors(model, args, expected):
    spec = WorkloadSpec(
        model=model, model_args=args, data="shapes", data_args={"n_train": 20, "n_val": 10}
    )
    with pytest.raises(WorkloadError, match=expected):
        load(spec)


# ---------------------------------------------------------------------------------------------
# The two pipelines
# ---------------------------------------------------------------------------------------------


def test_device_batches_shapes_dtype_and_label_alignment():
    # every image is filled with its label's value: alignment survives shuffling and cropping
    labels = torch.arange(100) % 10
    images = (labels * 20 + 10).to(torch.uint8)[:, None, None, None].expand(100, 3, 32, 32)
    dataset = ImageTensorDataset(images.contiguous(), labels, (0.0,) * 3, (1.0,) * 3, augment=True)
    batches = DeviceBatches(dataset, 32, DEVICE, torch.Generator().manual_seed(0))
    seen = []
    for inputs, targets in batches:
        assert inputs.shape == (32, 3, 32, 32) and inputs.dtype == torch.float32
        assert inputs.is_contiguous()  # NCHW, as a DataLoader gives: channels_last is a knob
        assert targets.dtype == torch.long
        centre = inputs[:, 0, 16, 16] * 255  # the centre is never padding
        assert torch.allclose(centre, (targets * 20 + 10).float(), atol=1e-3)
        seen += targets.tolist()
    assert len(batches) == 3 and len(seen) == 96  # the partial batch is dropped
    ordered = DeviceBatches(dataset, 32, DEVICE, shuffle=False)
    assert len(ordered) == 4 and sum(t.numel() for _, t in ordered) == 100


def _marker_positions(samples: torch.Tensor) -> torch.Tensor:
    """(row, column) of the brightest pixel of each augmented image (N, C, H, W)."""
    flat = samples[:, 0].flatten(1).argmax(dim=1)
    return torch.stack([flat // samples.shape[-1], flat % samples.shape[-1]], dim=1)


def test_both_pipelines_draw_the_same_augmentation_distribution():
    """A marker pixel off the centre shows where each crop and flip put the image."""
    count = 6000
    image = torch.zeros(1, 3, 16, 24, dtype=torch.uint8)
    image[0, :, 5, 4] = 255  # stays in view: rows 1..9, columns 0..8 (or 15..23 flipped)
    labels = torch.zeros(1, dtype=torch.long)
    dataset = ImageTensorDataset(image, labels, (0.0,) * 3, (1.0,) * 3, augment=True)
    torch.manual_seed(0)
    per_sample = torch.stack([dataset[0][0] for _ in range(count)])
    many = ImageTensorDataset(
        image.expand(count, -1, -1, -1).contiguous(),
        labels.expand(count),
        (0.0,) * 3,
        (1.0,) * 3,
        augment=True,
    )
    batched = torch.cat(
        [x for x, _ in DeviceBatches(many, 500, DEVICE, torch.Generator().manual_seed(1))]
    )
    assert batched.shape == per_sample.shape
    for axis, size in ((0, 16), (1, 24)):
        a = torch.bincount(_marker_positions(per_sample)[:, axis], minlength=size) / count
        b = torch.bincount(_marker_positions(batched)[:, axis], minlength=size) / count
        assert (a - b).abs().max() < 0.025, (axis, a, b)
    # rows: 5 + shift in -4..4, uniform; columns: mirrored half of the time
    rows = torch.bincount(_marker_positions(batched)[:, 0], minlength=16) / count
    assert rows[1:10].min() > 0.08 and rows[:1].sum() + rows[10:].sum() == 0
    cols = _marker_positions(batched)[:, 1]
    assert abs((cols >= 12).float().mean().item() - 0.5) < 0.03  # flipped half the time
    # whole-image statistics agree too (mean and spread of every pixel)
    assert (per_sample.mean(0) - batched.mean(0)).abs().max() < 0.02
    assert abs(per_sample.std().item() - batched.std().item()) < 0.01
    assert CROP_PADDING == 4


def test_device_pipeline_trains_and_gives_the_dataloader_accuracy_range():
    workload = load(
        WorkloadSpec(
            model="autotune.testing:tiny_cnn",
            model_args={"width": 32},
            data="shapes",
            data_args={"n_train": 1024, "n_val": 256, "difficulty": 0.0},
        )
    )
    config = make_config(epochs=5, batch_size=32, lr=5e-3)
    loader = make_train_loader(workload.train_set, config.replace(data_pipeline="device"), 0)
    assert isinstance(loader, DeviceBatches)
    device = train(config.replace(data_pipeline="device"), workload, never_stop)
    dataloader = train(config, workload, never_stop)
    assert device.optimizer_steps == dataloader.optimizer_steps == 160
    assert device.accuracy > 0.5 and dataloader.accuracy > 0.5  # 10 classes: chance is 0.1


def test_device_pipeline_is_offered_only_for_in_memory_data(tmp_path: Path):
    write_image_folder(tmp_path)
    text = f"""
workload:
  model: mlp
  data: imagefolder
  data_args: {{root: {tmp_path}}}
space:
  batch_size: 4
  data_pipeline: [dataloader, device]
  num_workers: [0, 2]
"""
    spec = parse_spec(text, "s.yaml")
    folder = restrict(spec, CPU, load(spec.workload))
    assert folder.spec.space.data_pipeline.values == ("dataloader",)
    assert "loads sample by sample" in folder.dropped[0].reason
    in_memory = parse_spec(
        text.replace("imagefolder", "shapes").replace(
            f"{{root: {tmp_path}}}", "{n_train: 20, n_val: 10}"
        ),
        "s.yaml",
    )
    kept = restrict(in_memory, CPU, load(in_memory.workload))
    assert kept.spec.space.data_pipeline.values == ("dataloader", "device")
