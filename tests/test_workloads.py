"""Workloads: the bundled digits data, built-in models, user entry points, and images: shapes,
CIFAR-10 and ImageFolder from disk, torchvision models."""

from __future__ import annotations

import math
import pickle
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from autotune.runner import train
from autotune.spec import WorkloadSpec
from autotune.testing import make_config, never_stop
from autotune.workloads import WorkloadError, load
from autotune.workloads.vision import SHAPES, shapes


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


def test_digits_cnn_learns_in_one_epoch():
    workload = load(WorkloadSpec(model="digits_cnn", data="digits"))
    result = train(make_config(epochs=1, lr=3e-3, batch_size=32), workload, never_stop)
    assert result.score > 0.85
    assert math.isfinite(result.evaluations[-1].train_loss)


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
        ("unlabeled", "a sample is a tuple of 1: it holds no target"),
    ]:
        spec = WorkloadSpec(model="mlp", data=f"odd_data:{function}")
        with pytest.raises(WorkloadError, match=re.escape(expected)):
            load(spec, base_dir=tmp_path)


def test_model_needing_num_classes_the_data_cannot_tell(tmp_path: Path):
    (tmp_path / "untold.py").write_text(
        "import torch\n"
        "def data():\n"
        "    d = [(torch.zeros(2), i % 2) for i in range(4)]  # a list of pairs: no classes\n"
        "    return d, d\n"
        "def floats():\n"
        "    d = [(torch.zeros(2), torch.tensor(0.5)) for i in range(4)]\n"
        "    return d, d\n"
    )
    with pytest.raises(WorkloadError, match=r"set workload\.model_args\.num_classes"):
        load(WorkloadSpec(model="mlp", data="untold:data"), base_dir=tmp_path)
    workload = load(
        WorkloadSpec(model="mlp", data="untold:data", model_args={"num_classes": 2}),
        base_dir=tmp_path,
    )
    assert workload.build_model()(torch.zeros(1, 2)).shape == (1, 2)
    # float labels are named as what they are, not as a missing class count
    with pytest.raises(WorkloadError, match=r"labels are float32; .* need integer class indices"):
        load(WorkloadSpec(model="mlp", data="untold:floats"), base_dir=tmp_path)


# ---------------------------------------------------------------------------------------------
# Images
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
    assert 0 <= result.score <= 1


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


def test_imagefolder_trains_one_epoch(image_folder: Path):
    spec = WorkloadSpec(model="mlp", data="imagefolder", data_args={"root": str(image_folder)})
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


def test_the_spec_knows_the_built_in_model_families():
    """``WorkloadSpec.user_entry_points`` tells built-in families from user code without
    importing torch: its list of family names is the registry's."""
    from autotune.spec import MODEL_FAMILY_NAMES
    from autotune.workloads import MODEL_FAMILIES

    assert set(MODEL_FAMILY_NAMES) == set(MODEL_FAMILIES)
    spec = WorkloadSpec(model="torchvision:resnet18", data="proj.data:load", loss="proj:loss")
    assert spec.user_entry_points() == ["proj.data:load", "proj:loss"]
    assert WorkloadSpec(model="proj:net", data="digits").user_entry_points() == ["proj:net"]
