"""Workloads: the bundled digits data, built-in models and user entry points."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch

from autotune.spec import WorkloadSpec
from autotune.workloads import WorkloadError, load


def test_digits_split_is_fixed_stratified_and_disjoint():
    workload = load(WorkloadSpec(model="digits_cnn", data="digits"))
    train, val = workload.train_set, workload.val_set
    assert (len(train), len(val)) == (1437, 360)
    assert workload.num_classes == 10 and workload.input_shape == (1, 8, 8)
    train_x, train_y = train.tensors
    val_x, val_y = val.tensors
    # stratified: every class has 20% +- one image in validation
    for label in range(10):
        share = (val_y == label).sum() / ((val_y == label).sum() + (train_y == label).sum())
        assert abs(share.item() - 0.2) < 0.02
    # no validation image appears in the training split
    train_rows = {tuple(row.tolist()) for row in train_x.flatten(1)}
    duplicates_in_digits = sum(tuple(row.tolist()) in train_rows for row in val_x.flatten(1))
    assert duplicates_in_digits <= 2  # the raw data set holds a couple of identical images
    # standardized with training statistics
    assert abs(train_x.mean().item()) < 1e-5 and abs(train_x.std().item() - 1) < 1e-4
    again = load(WorkloadSpec(model="digits_cnn", data="digits"))
    assert torch.equal(again.val_set.tensors[0], val_x)


def test_builtin_models_build_for_the_data():
    workload = load(WorkloadSpec(model="mlp", data="digits", model_args={"hidden": 8}))
    model = workload.build_model()
    logits = model(workload.train_set[0][0].unsqueeze(0))
    assert logits.shape == (1, 10)
    cnn = load(WorkloadSpec(model="digits_cnn", data="digits")).build_model()
    assert cnn(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_user_entry_points_next_to_the_space_file(tmp_path: Path):
    (tmp_path / "my_project.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            from torch.utils.data import TensorDataset

            def data(n=40):
                x = torch.randn(n, 5)
                y = torch.arange(n) % 3
                return TensorDataset(x, y), TensorDataset(x[:10], y[:10])

            def model(num_classes, width=7):
                return nn.Sequential(nn.Linear(5, width), nn.ReLU(), nn.Linear(width, num_classes))
            """
        )
    )
    spec = WorkloadSpec(
        model="my_project:model",
        model_args={"width": 3},
        data="my_project:data",
        data_args={"n": 30},
    )
    workload = load(spec, base_dir=tmp_path)
    assert workload.num_classes == 3  # inferred from the labels
    assert len(workload.train_set) == 30 and workload.input_shape == (5,)
    assert workload.build_model()[0].out_features == 3
    assert workload.build_model() is not workload.build_model()  # fresh weights each trial


@pytest.mark.parametrize(
    ("model", "data", "data_args", "expected"),
    [
        ("digit_cnn", "digits", {}, "unknown model 'digit_cnn'; did you mean 'digits_cnn'?"),
        ("digits_cnn", "cifar", {}, "unknown data set 'cifar'"),
        ("nowhere_pkg:model", "digits", {}, "no module named 'nowhere_pkg'"),
        ("autotune.testing:nothing", "digits", {}, "has no attribute 'nothing'"),
        ("autotune.testing:", "digits", {}, "must look like 'package.module:function'"),
        (
            "digits_cnn",
            "digits",
            {"val_fraction": 0.2, "colour": 1},
            "cannot be called with val_fraction, colour",
        ),
        ("autotune.testing:SlowDataset", "digits", {}, "cannot be called with"),
        ("autotune.spec:parse_spec", "digits", {}, "cannot be called with"),
        ("digits_cnn", "autotune.testing:tiny_mlp", {}, "cannot be called with"),
    ],
)
def test_resolution_errors_are_one_line(model, data, data_args, expected):
    with pytest.raises(WorkloadError) as caught:
        load(WorkloadSpec(model=model, data=data, data_args=data_args))
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_data_functions_must_return_two_splits(tmp_path: Path):
    (tmp_path / "odd_data.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def one():\n    return [1, 2, 3]\n"
        "def empty():\n"
        "    e = TensorDataset(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))\n"
        "    return e, e\n"
        "def unlabeled():\n"
        "    d = TensorDataset(torch.zeros(4, 2))\n"
        "    return d, d\n"
    )
    for function, expected in [
        ("one", "must return (train_dataset, val_dataset)"),
        ("empty", "the training split is empty"),
        ("unlabeled", "must be an (input, label) pair"),
    ]:
        spec = WorkloadSpec(model="mlp", data=f"odd_data:{function}")
        with pytest.raises(WorkloadError, match=re.escape(expected)):
            load(spec, base_dir=tmp_path)


def test_model_needing_num_classes_the_data_cannot_tell(tmp_path: Path):
    (tmp_path / "floaty.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def data():\n"
        "    d = TensorDataset(torch.zeros(4, 2), torch.zeros(4))\n"
        "    return d, d\n"
    )
    with pytest.raises(WorkloadError, match=r"set workload\.model_args\.num_classes"):
        load(WorkloadSpec(model="mlp", data="floaty:data"), base_dir=tmp_path)
    workload = load(
        WorkloadSpec(model="mlp", data="floaty:data", model_args={"num_classes": 2}),
        base_dir=tmp_path,
    )
    assert workload.build_model()(torch.zeros(1, 2)).shape == (1, 2)
