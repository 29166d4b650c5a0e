"""Workloads: the bundled digits data, built-in models, user entry points, and images: shapes,
CIFAR-10 and ImageFolder from disk, torchvision models."""

from __future__ import annotations

import math
import pickle
import re
import signal
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from autotune.spacefile import WorkloadSpec, parse_spec
from autotune.testing import make_config, never_stop
from autotune.training.runner import train
from autotune.workloads import DataSplits, WorkloadError, load
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
            "autotune.testing:tiny_mpl",
            "digits",
            {},
            "autotune/testing/__init__.py) has no attribute 'tiny_mpl'; did you mean 'tiny_mlp'?",
        ),
        # Python's own module of the name the user meant to give theirs: the file says so
        ("signal:conv1d_net", "digits", {}, f"signal ({signal.__file__}) has no attribute"),
        # a module not found: each folder looked in once (the working directory is the same)
        ("nowhere_pkg:model", "digits", {}, f"(looked in {Path.cwd().resolve()} and the"),
        (
            "digits_cnn",
            "digits",
            {"val_fraction": 0.2, "colour": 1},
            "cannot be called with val_fraction, colour",
        ),
        ("autotune.testing:FaultyDataset", "digits", {}, "cannot be called with"),
        ("autotune.spacefile:parse_spec", "digits", {}, "cannot be called with"),
        ("digits_cnn", "autotune.testing:tiny_mlp", {}, "cannot be called with"),
    ],
)
def test_resolution_errors_are_one_line(model, data, data_args, expected):
    with pytest.raises(WorkloadError) as caught:
        load(WorkloadSpec(model=model, data=data, data_args=data_args), base_dir=Path.cwd())
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        ("  model: autotune.testing:tiny_mpl\n  data: digits\n", "s.yaml:3: model 'autotune"),
        ("  model: mlp\n  data: autotune.testing:nowhere\n", "s.yaml:4: data set 'autotune"),
        ("  model: mlp\n  data: digits\n  loss: nowhere_pkg:loss\n", "s.yaml:5: loss 'nowhere"),
    ],
)
def test_a_name_that_does_not_resolve_is_told_at_its_line_in_the_space_file(workload, expected):
    spec = parse_spec(f"study: {{n_trials: 2}}\nworkload:\n{workload}", "s.yaml")
    for loaded in (spec, spec.with_overrides(workload={"device": "cpu"})):  # as `autotune run`
        with pytest.raises(WorkloadError) as caught:
            load(loaded.workload, base_dir=Path.cwd())
        assert str(caught.value).startswith(expected), caught.value
    # a name given in place of the file's is not the file's to point at
    given = {"model": "autotune.testing:tiny_mpl", "data": "digits", "loss": "cross_entropy"}
    with pytest.raises(WorkloadError, match=r"^model 'autotune"):
        load(spec.with_overrides(workload=given).workload, base_dir=Path.cwd())


def test_a_misspelt_argument_is_told_at_its_line_with_the_parameter_it_meant():
    """A new user's ``model_args: {layer: 2}`` (for ``layers``) got "cannot be called with"
    and no line, unlike every other key of the space file."""
    text = (
        "study: {n_trials: 2}\nworkload:\n  model: digits_cnn\n"
        "  model_args: {widht: 8}\n  data: digits\n  data_args:\n    val_fractoin: 0.2\n"
    )
    spec = parse_spec(text, "s.yaml")
    with pytest.raises(WorkloadError) as caught:
        load(spec.workload, base_dir=Path.cwd())
    said = str(caught.value)
    assert said.startswith("s.yaml:6: data set 'digits' cannot be called with val_fractoin")
    assert said.endswith("; did you mean 'val_fraction'?")
    fixed = parse_spec(text.replace("val_fractoin", "val_fraction"), "s.yaml")
    with pytest.raises(WorkloadError) as caught:
        load(fixed.workload, base_dir=Path.cwd())
    said = str(caught.value)
    assert said.startswith("s.yaml:4: model 'digits_cnn' cannot be called with")
    assert said.endswith("; did you mean 'width'?") and "\n" not in said


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
        "def tensor_pairs():\n"
        "    d = TensorDataset(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))\n"
        "    return d.tensors, d.tensors\n"
        "def arrays():\n"
        "    import numpy as np\n"
        "    x, y = np.zeros((4, 2), dtype=np.float32), np.zeros(4, dtype=np.int64)\n"
        "    return (x, y), (x, y)\n"
        "def rows():\n"
        "    d = TensorDataset(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))\n"
        "    return d.tensors[0], d\n"
    )
    for function, expected in [
        # where the function is: a user's error says where it was raised; this one where the
        # function is defined
        (
            "one",
            f"'odd_data:one' (defined at {tmp_path / 'odd_data.py'}:3) returned list; it must",
        ),
        ("empty", "the training split is empty"),
        ("unlabeled", "a sample is a tuple of 1: it holds no target"),
        (
            "tensor_pairs",
            "split is a tuple of 2 tensors, not a Dataset of samples: wrap them in "
            "TensorDataset(x, y)",
        ),
        (  # a new user's numpy arrays read "a sample is a ndarray"
            "arrays",
            f"(defined at {tmp_path / 'odd_data.py'}:14): the training split is a tuple of 2 "
            "numpy arrays, not a Dataset of samples: wrap them in "
            "TensorDataset(torch.as_tensor(x), torch.as_tensor(y))",
        ),
        (
            "rows",
            "a sample is a Tensor; it must be a tuple (such as (input, label)) or a dict "
            "(such as {'input_ids': ..., 'labels': ...}); wrap inputs and labels in TensorDataset",
        ),
    ]:
        spec = WorkloadSpec(model="mlp", data=f"odd_data:{function}")
        with pytest.raises(WorkloadError, match=re.escape(expected)):
            load(spec, base_dir=tmp_path)


# ---------------------------------------------------------------------------------------------
# num_classes: said by the data set, read off its labels, or the model function's default
# ---------------------------------------------------------------------------------------------

CLASSES_MODULE = """
import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.workloads._classes import LABEL_READ_LIMIT

READS = []  # indices read, by every data set here


class Records(Dataset):
    \"\"\"Samples built on demand (nothing says how many classes): dicts, or tuples.\"\"\"

    def __init__(self, n, classes, style="dict", offset=0):
        self.n, self.classes_seen, self.style, self.offset = n, classes, style, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        READS.append(i)
        x = torch.full((4,), float(i % 7))
        y = (i + self.offset) % self.classes_seen
        if self.style == "dict":
            return {"x": x, "y": y}
        if self.style == "triple":
            return x, torch.zeros(2), torch.tensor(y)
        return x, y


def dicts(classes=3, val_classes=None):
    return Records(60, classes), Records(20, val_classes or classes, offset=1)


def triples():
    return Records(60, 5, "triple"), Records(20, 5, "triple")


def pairs():
    return [(torch.zeros(4), i % 2) for i in range(8)], [(torch.zeros(4), 1)] * 4


def too_many():  # more samples than the bounded pass reads
    return Records(LABEL_READ_LIMIT + 1, 3), Records(20, 3)


def floats():
    return [(torch.zeros(4), torch.tensor(0.5))] * 4, [(torch.zeros(4), torch.tensor(0.5))] * 4


class Net(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.head = nn.Linear(4, num_classes)

    def forward(self, x):
        return self.head(x)


def tiny_transformer(num_classes=2):  # its own default: nothing needed from autotune
    return Net(num_classes)


def needs_classes(num_classes):
    return Net(num_classes)
"""


@pytest.fixture
def classes_dir(user_module) -> Path:
    return user_module("classes_data", CLASSES_MODULE)


def _classes_spec(model: str, data: str, **workload: object) -> WorkloadSpec:
    return WorkloadSpec(
        model=f"classes_data:{model}",
        data=f"classes_data:{data}",
        **workload,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("data", "workload", "expected"),
    [
        ("dicts", {"target": "y"}, 3),  # dicts, the target under workload.target
        ("triples", {"target": 2, "inputs": 0}, 5),  # a longer tuple's target by index
        ("pairs", {}, 2),  # a plain list of (input, int) pairs
    ],
)
def test_num_classes_is_read_from_the_labels_of_any_map_style_data_set(
    classes_dir: Path, data: str, workload: dict, expected: int
):
    loaded = load(_classes_spec("needs_classes", data, **workload), base_dir=classes_dir)
    assert loaded.num_classes == expected
    assert loaded.model_kwargs["num_classes"] == expected
    assert loaded.build_model().head.out_features == expected


def test_the_labels_read_are_of_both_splits_and_beat_the_models_default(classes_dir: Path):
    """The issue's model: ``tiny_transformer(num_classes=2)`` on dict samples of 4 classes,
    one of them only in the validation split; what the labels say wins over the default."""
    data_args = {"classes": 3, "val_classes": 4}
    spec = _classes_spec("tiny_transformer", "dicts", target="y", data_args=data_args)
    loaded = load(spec, base_dir=classes_dir)
    assert loaded.num_classes == 4 and loaded.build_model().head.out_features == 4


def _samples_read() -> int:
    """Samples the test's data sets have read so far (of the copy load() imported)."""
    return len(sys.modules["classes_data"].READS)


def test_the_models_own_default_stands_when_the_data_set_cannot_tell(classes_dir: Path):
    loaded = load(_classes_spec("tiny_transformer", "too_many", target="y"), base_dir=classes_dir)
    assert loaded.num_classes is None and "num_classes" not in loaded.model_kwargs
    assert loaded.build_model().head.out_features == 2  # its default
    # the bounded pass reads none of a split over the bound: only the few samples the check
    # before the study runs through the model
    assert _samples_read() < 10, _samples_read()

    # without a default the user is asked, in one line
    with pytest.raises(WorkloadError, match=r"set workload\.model_args\.num_classes") as caught:
        load(_classes_spec("needs_classes", "too_many", target="y"), base_dir=classes_dir)
    assert "\n" not in str(caught.value)
    given = _classes_spec("needs_classes", "too_many", target="y", model_args={"num_classes": 3})
    assert load(given, base_dir=classes_dir).build_model().head.out_features == 3


def test_a_num_classes_the_space_file_gives_is_not_read_off_the_labels(classes_dir: Path):
    # labels 0 to 2, and the user says 5 (two classes are absent from this data): 5 is taken,
    # and the labels are not read for it
    spec = _classes_spec("needs_classes", "dicts", target="y", model_args={"num_classes": 5})
    loaded = load(spec, base_dir=classes_dir)
    assert loaded.num_classes == 5 and loaded.build_model().head.out_features == 5
    assert _samples_read() < 10, _samples_read()


def test_reading_the_labels_leaves_the_random_state_and_skips_float_targets(classes_dir: Path):
    from autotune.workloads._classes import count_classes
    from autotune.workloads.batches import BatchLayout

    load(_classes_spec("needs_classes", "pairs"), base_dir=classes_dir)  # imports it
    classes_data = sys.modules["classes_data"]
    train_set, val_set = classes_data.dicts()
    state = torch.random.get_rng_state()
    splits = DataSplits(train_set, val_set)
    assert count_classes(splits, BatchLayout(None, "y"), "dicts") == 3
    assert torch.equal(torch.random.get_rng_state(), state)
    assert count_classes(DataSplits(*classes_data.floats()), BatchLayout(), "floats") is None
    # float labels are named as what they are, not as a missing class count
    with pytest.raises(WorkloadError, match=r"labels are float32; .* need integer class indices"):
        load(_classes_spec("needs_classes", "floats"), base_dir=classes_dir)


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
        data_args={"n_train": 16, "n_val": 8},  # a ResNet on the CPU: as few images as will do
    )
    workload = load(spec)
    model = workload.build_model()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert model.fc.out_features == 10  # num_classes from the data
    plain = load(spec.model_copy(update={"model_args": {}})).build_model()
    assert plain.conv1.kernel_size == (7, 7)
    result = train(make_config(batch_size=8, epochs=1), workload, never_stop)
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
    from autotune.spacefile import MODEL_FAMILY_NAMES
    from autotune.workloads import MODEL_FAMILIES

    assert set(MODEL_FAMILY_NAMES) == set(MODEL_FAMILIES)
    spec = WorkloadSpec(model="torchvision:resnet18", data="proj.data:load", loss="proj:loss")
    assert spec.user_entry_points() == ["proj.data:load", "proj:loss"]
    assert WorkloadSpec(model="proj:net", data="digits").user_entry_points() == ["proj:net"]


def test_a_built_in_is_imported_only_when_a_workload_names_it():
    """scikit-learn and torchvision take seconds to import: a process that loads the user's own
    workload (every worker of such a study) never imports them; naming a built-in does."""
    import subprocess

    program = textwrap.dedent(
        """
        import sys
        import autotune.worker
        from autotune.spacefile import WorkloadSpec, parse_spec
        from autotune.workloads import load

        def imported():
            return [name for name in ("sklearn", "torchvision") if name in sys.modules]

        load(WorkloadSpec(model="autotune.testing:tiny_mlp", data="autotune.testing:blobs"))
        print(imported())
        load(WorkloadSpec(model="digits_cnn", data="digits"))
        print(imported())
        load(WorkloadSpec(model="torchvision:resnet18", data="shapes",
                          data_args={"n_train": 4, "n_val": 4}))
        print(imported())
        """
    )
    found = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split("\n")[:3] == ["[]", "['sklearn']", "['sklearn', 'torchvision']"]


def test_the_language_model_space_scores_next_tokens_with_the_classes_last():
    """search_spaces/language_model.yaml (a GPU space): its model's logits are [batch,
    sequence, vocabulary] for targets [batch, sequence], read classes-last; the sequence (64)
    is not the vocabulary (256), so the axis is never ambiguous."""
    from autotune.spacefile import load_spec

    spaces = Path(__file__).parents[1] / "search_spaces"
    spec = load_spec(spaces / "language_model.yaml")
    small = spec.workload.model_copy(
        update={
            "data_args": {"n_train": 64, "n_val": 32},
            "model_args": {"width": 32, "layers": 1, "heads": 2},
        }
    )
    workload = load(small, spaces, spec.objective.score)
    assert workload.classes_last and workload.num_classes == 256
    assert tuple(workload.input_shape) == (64,)
