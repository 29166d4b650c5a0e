"""How batches reach the device: per-sample DataLoader and batched on the device, drawing the same
augmentation, aligned labels, and the accuracy a DataLoader gives."""

from __future__ import annotations

import torch

from autotune.pipeline import CROP_PADDING, DeviceBatches, ImageTensorDataset, make_train_loader
from autotune.spacefile import WorkloadSpec
from autotune.testing import make_config, never_stop
from autotune.training.runner import train
from autotune.workloads import load

DEVICE = torch.device("cpu")


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
    assert device.score > 0.5 and dataloader.score > 0.5  # 10 classes: chance is 0.1
