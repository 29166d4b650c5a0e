"""The check before the study (one real batch through the model) and scoring any target shape."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.machine.hardware import detect
from autotune.search.space import restrict
from autotune.semantics import IGNORE_INDEX, classification_sums
from autotune.spacefile import WorkloadSpec, parse_spec
from autotune.testing import make_config, never_stop
from autotune.training.runner import train
from autotune.workloads import WorkloadError, load

# Workloads as a new user writes them: each data function returns (train, val), each model
# function an nn.Module; most of them wrong in one way.
USER_MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.utils.data import Dataset, TensorDataset

    def blobs(n=64, classes=3, val=32, float_labels=False):
        g = torch.Generator().manual_seed(0)
        y = torch.arange(n + val) % classes
        x = torch.randn(n + val, 6, generator=g) + y[:, None].float()
        if float_labels:
            y = y.float()
        return TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])

    def broken_data():
        settings = {"path": "/data"}
        return settings["root"]  # the user's bug: line 16

    def missing_file():
        return open("/no/such/folder/train.csv")  # line 19

    class Unreadable(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, index):
            raise IndexError("shard 3 is missing")

    def unreadable():
        return Unreadable(), Unreadable()

    def masks(n=24, val=12, size=6):
        # segmentation: one class per pixel, 3 classes; the label is the brightest channel
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n + val, 3, size, size, generator=g)
        y = x.argmax(dim=1)
        y[:, 0, 0] = -100  # a padding pixel: neither trained on nor scored
        return TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])

    def linear(num_classes):
        return nn.Linear(6, num_classes)

    def ten_outputs():
        return nn.Linear(6, 10)

    def two_outputs():
        return nn.Linear(6, 2)

    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(6, 3)
        def forward(self, x):
            return {"scores": self.head(x)}

    def dict_out():
        return DictOut()

    class Crashes(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(5, 3)  # the user's bug: the inputs have 6 features
        def forward(self, x):
            return self.head(x)

    def crashes():
        return Crashes()

    class ClassesLast(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)
        def forward(self, x):
            return self.conv(x).permute(0, 2, 3, 1)

    def classes_last():
        return ClassesLast()

    def pixels(num_classes):
        return nn.Conv2d(3, num_classes, 3, padding=1)

    def tokens(n=32, val=16, length=6):
        # next-token prediction whose sequence length equals its vocabulary (6)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, length, (n + val, length + 1), generator=g)
        return TensorDataset(x[:n, :-1], x[:n, 1:]), TensorDataset(x[n:, :-1], x[n:, 1:])

    def bigram(num_classes):
        return nn.Embedding(num_classes, num_classes)  # logits [batch, sequence, vocabulary]

    class Arrays(Dataset):  # what many users write: indexing numpy arrays gives numpy values
        def __init__(self, x, y):
            self.x, self.y = x, y
        def __len__(self):
            return len(self.y)
        def __getitem__(self, index):
            return self.x[index], self.y[index]

    def arrays(labels="numpy"):
        splits = []
        for split in blobs():
            x, y = split.tensors
            y = y.numpy() if labels == "numpy" else [int(label) for label in y]
            splits.append(Arrays(x.numpy(), y))
        return splits

    def shaped(num_classes, input_shape):
        return nn.Linear(input_shape[0], num_classes)

    def nan_loss(output, target):
        return nn.functional.cross_entropy(output, target) * float("nan")

    def nan_weights(num_classes):
        layer = nn.Linear(6, num_classes)
        nn.init.constant_(layer.bias, float("nan"))
        return layer
    """
)


@pytest.fixture
def user_dir(user_module) -> Path:
    return user_module("odd_workloads", USER_MODULE)


def _load(
    folder: Path,
    model: str,
    data: str = "blobs",
    class_dim: int | None = None,
    loss: str = "cross_entropy",
    **data_args: Any,
):
    spec = WorkloadSpec(
        model=f"odd_workloads:{model}",
        data=f"odd_workloads:{data}",
        data_args=data_args,
        class_dim=class_dim,
        loss=loss,
    )
    return load(spec, base_dir=folder)


@pytest.mark.parametrize(
    ("model", "data", "data_args", "expected"),
    [
        (
            "ten_outputs",
            "blobs",
            {},
            "outputs 10 classes but data set 'odd_workloads:blobs' has 3",
        ),
        ("two_outputs", "blobs", {}, "outputs 2 classes but"),
        (
            "linear",
            "blobs",
            {"float_labels": True},
            "labels are float32; the loss .* need integer class indices",
        ),
        ("dict_out", "blobs", {}, r"returned dict of 'scores'; the score \(accuracy\) reads"),
        (
            "linear",
            "masks",
            {},
            r"output \[2, 3, 6, 3\] does not fit targets \[2, 6, 6\]: .*\[2, classes, 6, 6\]",
        ),
        ("crashes", "masks", {}, r"fails on a training batch \(float32 \[2, 3, 6, 6\]\)"),
        (
            "crashes",
            "blobs",
            {},
            r"RuntimeError: mat1 and mat2 shapes cannot be multiplied.* \(at .*in forward\)",
        ),
        ("linear", "broken_data", {}, r"'odd_workloads:broken_data' raised KeyError: 'root'"),
        (
            "linear",
            "missing_file",
            {},
            r"raised FileNotFoundError: .*/no/such/folder/train.csv' "
            r"\(at .*odd_workloads.py:19 in missing_file\)",
        ),
        ("linear", "unreadable", {}, r"reading training sample 0 raised IndexError: shard 3"),
    ],
)
def test_a_workload_that_cannot_train_or_be_scored_is_refused_in_one_line(
    user_dir: Path, model: str, data: str, data_args: dict, expected: str
):
    with pytest.raises(WorkloadError) as caught:
        _load(user_dir, model, data, **data_args)
    message = str(caught.value)
    assert re.search(expected, message), message
    assert "\n" not in message


@pytest.mark.parametrize("labels", ["numpy", "int"])
def test_numpy_samples_are_read_as_the_dataloader_collates_them(user_dir: Path, labels: str):
    # numpy inputs with numpy int64 or Python int labels: torch's default_collate batches them
    workload = _load(user_dir, "shaped", "arrays", labels=labels)
    assert workload.input_shape == (6,) and workload.num_classes == 3
    result = train(make_config(epochs=1, lr=0.05, batch_size=8), workload, never_stop)
    assert 0.0 <= result.score <= 1.0


@pytest.mark.parametrize(
    ("model", "loss", "blamed"),
    [
        ("linear", "odd_workloads:nan_loss", "loss 'odd_workloads:nan_loss' returns nan on a"),
        ("nan_weights", "cross_entropy", "model 'odd_workloads:nan_weights' gives a training"),
        ("nan_weights", "odd_workloads:nan_loss", "model 'odd_workloads:nan_weights' gives a"),
    ],
)
def test_a_loss_of_nan_before_training_blames_the_loss_only_when_the_output_is_finite(
    user_dir: Path, model: str, loss: str, blamed: str
):
    with pytest.raises(WorkloadError) as caught:
        _load(user_dir, model, loss=loss)
    assert str(caught.value).startswith(blamed), caught.value


def test_an_error_in_the_users_code_names_the_line_it_was_raised_on(user_dir: Path):
    with pytest.raises(WorkloadError) as caught:
        _load(user_dir, "linear", "broken_data")
    assert str(caught.value).endswith("odd_workloads.py:16 in broken_data)")


def test_a_small_validation_split_is_warned_about_and_a_fitting_one_is_not(user_dir: Path):
    small = _load(user_dir, "linear", val=5)
    assert len(small.warnings) == 1
    assert "5 scored targets: accuracy moves in steps of 0.2" in small.warnings[0]
    # a segmentation target scores every pixel: 12 masks of 36 pixels, one pixel padding
    pixels = _load(user_dir, "pixels", "masks")
    assert pixels.warnings == ()
    assert _load(user_dir, "linear", val=100).warnings == ()


def test_accuracy_counts_every_scored_target_element_not_samples():
    logits = torch.zeros(2, 3, 2, 2)
    logits[:, 1] = 1.0  # predicts class 1 everywhere
    targets = torch.tensor([[[1, 1], [0, IGNORE_INDEX]], [[1, 2], [1, 1]]])
    right, loss, scored = classification_sums(logits, targets)
    assert (int(right), int(scored)) == (5, 7)  # 5 of the 7 scored pixels are class 1
    expected = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    assert float(loss) == pytest.approx(float(expected))
    # one class per sample: unchanged
    right, _, scored = classification_sums(torch.eye(3), torch.tensor([0, 2, 2]))
    assert (int(right), int(scored)) == (2, 3)


@pytest.mark.parametrize("model", ["pixels", "classes_last"])
def test_a_segmentation_trial_scores_a_share_of_pixels(user_dir: Path, model: str):
    workload = _load(user_dir, model, "masks")
    # logits [batch, 6, 6, classes], as a Hugging Face token classifier gives them: read as such
    assert workload.classes_last == (model == "classes_last")
    result = train(make_config(epochs=2, lr=0.05, batch_size=8), workload, never_stop)
    # the brightest channel is learnable by a 3x3 or a 1x1 convolution: well above chance (1/3),
    # never above 1
    assert 0.6 < result.score <= 1.0
    assert all(0.0 <= e.score <= 1.0 for e in result.evaluations)


def test_logits_that_fit_either_class_dimension_are_refused_until_the_space_names_it(
    user_dir: Path,
):
    # [B, 6, 6] against [B, 6]: read as classes-first, it trains on the wrong axis silently
    with pytest.raises(WorkloadError, match=r"dimension 1 or in the last; say which"):
        _load(user_dir, "bigram", "tokens")
    assert _load(user_dir, "bigram", "tokens", class_dim=-1).classes_last
    assert not _load(user_dir, "bigram", "tokens", class_dim=1).classes_last
    with pytest.raises(WorkloadError, match=r"cannot hold the classes in dimension 1 \(workload"):
        _load(user_dir, "classes_last", "masks", class_dim=1)
    assert not _load(user_dir, "linear", class_dim=-1).classes_last  # [B, classes]: one reading


def test_channels_last_is_not_searched_for_inputs_that_are_not_images(user_dir: Path):
    spec = parse_spec(
        "workload: {model: mlp, data: digits}\n"
        "space: {channels_last: [true, false], batch_size: [8]}\n",
        "s.yaml",
    )
    flat = restrict(spec, detect("cpu"), _load(user_dir, "linear"))
    assert flat.spec.space.channels_last.values == (False,)
    assert [d.describe() for d in flat.dropped] == [
        "channels_last true: it reorders 4-D image batches only; one input here is [6]"
    ]
    images = restrict(spec, detect("cpu"), _load(user_dir, "pixels", "masks"))
    assert images.spec.space.channels_last.values == (True, False)


LOUD = """
import torch.nn as nn


class Loud(nn.Linear):
    def forward(self, x):
        print("forward", tuple(x.shape))
        return super().forward(x)


def loud(num_classes, input_shape):
    print("building the model")
    return Loud(input_shape[0], num_classes)
"""


def test_what_the_users_code_prints_during_the_check_is_held_and_said(
    user_module, tmp_path: Path, capsys
):
    """A model that prints in forward printed above the run's plan while the workload was
    checked; it is held, and said among the plan's warnings, unless --verbose."""
    from autotune import session

    folder = user_module("loud_model", LOUD)
    storage = f"sqlite:///{tmp_path / 'loud.db'}"
    text = f"""\
study: {{name: loud, n_trials: 2, isolation: none, storage: "{storage}"}}
workload: {{model: loud_model:loud, data: autotune.testing:blobs, epochs: 1}}
space: {{lr: {{low: 0.01, high: 0.1, log: true}}}}
"""
    spec = parse_spec(text, folder / "space.yaml")
    held = session.prepare(spec, folder)
    assert "building the model" not in capsys.readouterr().out
    (note,) = [line for line in held.workload.warnings if "your code printed" in line]
    assert "while autotune checked the workload (the first: 'building the model')" in note
    shown = session.prepare(spec, folder, verbose=True)
    assert "building the model" in capsys.readouterr().out
    assert not any("your code printed" in line for line in shown.workload.warnings)
