"""Exported scripts for batches of other structures and other losses: a Hugging Face style
workload (dict samples, the model's own loss) and a tuple of three with the user's loss function,
each exported from a real study and run outside the repository without autotune."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.export import best_config, render_script, select_trial
from autotune.testing import import_blocker

SEARCH_SPACES = Path(__file__).parents[1] / "search_spaces"

# one stage for the text workload (stage 1 is not the subject); the triples keep theirs, which
# times channels_last
TEXT_SPACE = """\
study: {name: text, n_trials: 1, pruner: none, strategy: joint, confirm: false}
workload:
  model: text_workload:transformer
  model_args: {width: 16}
  data: text_workload:topics
  data_args: {train_size: 512, val_size: 128, length: 12}
  epochs: 1
  loss: model
space: {batch_size: 32, lr: 1.0e-2}
"""

TRIPLE_SPACE = """\
study: {name: triple, n_trials: 1, pruner: none, confirm: false}
workload:
  model: triple_workload:two_inputs
  data: triple_workload:triples
  target: 2
  loss: triple_workload:smoothed
  epochs: 1
space: {batch_size: 16, lr: 3.0e-2, channels_last: true}
"""

TRIPLE_MODULE = """\
import torch
from torch import nn
from torch.utils.data import TensorDataset


def triples(count: int = 1024):
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(count, 3, 4, 4, generator=generator)
    vectors = torch.randn(count, 4, generator=generator)
    labels = ((images.mean((1, 2, 3)) + vectors.mean(1)) > 0).long()
    train = TensorDataset(images[:768], vectors[:768], labels[:768])
    return train, TensorDataset(images[768:], vectors[768:], labels[768:])


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Linear(48, 2)
        self.vector = nn.Linear(4, 2)

    def forward(self, image, vector):
        return self.image(image.flatten(1)) + self.vector(vector)


def two_inputs():
    return TwoInputs()


def smoothed(output, target):
    return nn.functional.cross_entropy(output, target, label_smoothing=0.05)


def by_name(batch):
    image, vector, label = batch
    return (), {"image": image, "vector": vector}, label
"""


def _exported(prepare_study, folder: Path, space: str) -> str:
    study = prepare_study(space, folder).study
    return render_script(study, best_config(study, select_trial(study)))


# each script as ``python train.py --epochs 3`` runs it, in its own folder, one after another in
# one interpreter (torch is imported once, not three times); the user's module each imports is
# its own folder's, not the one the script before imported
RUN_EACH = """
import os, runpy, sys
for folder in sys.argv[1:]:
    print("=== " + folder, flush=True)
    os.chdir(folder)
    sys.argv, path, modules = ["train.py", "--epochs", "3"], list(sys.path), set(sys.modules)
    try:
        runpy.run_path("train.py", run_name="__main__")
    except SystemExit as done:
        if done.code:
            raise
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name.endswith("_workload"):
            del sys.modules[name]
"""

WORKLOADS = ("text", "triple", "batch_fn")


@pytest.fixture(scope="module")
def exported(
    prepare_study, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[str, str]]:
    """Each workload's exported script (its text) and what it printed, run outside the
    repository without autotune: one real study each, then the three scripts in one process
    where importing autotune fails."""
    root = tmp_path_factory.mktemp("batches")
    texts, folders = {}, []
    for workload in WORKLOADS:
        study_dir = root / workload / "study"
        study_dir.mkdir(parents=True)
        if workload == "text":
            shutil.copy(SEARCH_SPACES / "text_workload.py", study_dir)
            space = TEXT_SPACE
        else:
            (study_dir / "triple_workload.py").write_text(TRIPLE_MODULE)
            space = TRIPLE_SPACE
            if workload == "batch_fn":  # the user's function splits the batch
                space = space.replace("target: 2", "batch_fn: triple_workload:by_name")
        texts[workload] = _exported(prepare_study, study_dir, space)
        script = root / workload / "elsewhere" / "train.py"
        script.parent.mkdir()
        script.write_text(texts[workload])
        folders.append(str(script.parent))
    blocker = import_blocker(root, "autotune")
    done = subprocess.run(
        [sys.executable, "-c", RUN_EACH, *folders],
        cwd=root,
        env={"PYTHONPATH": str(blocker), "PYTHONWARNINGS": "ignore", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outputs = done.stdout.split("=== ")[1:]
    assert [output.split("\n", 1)[0] for output in outputs] == folders
    return {w: (texts[w], output) for w, output in zip(WORKLOADS, outputs, strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "chance"), [("text", 0.25), ("triple", 0.5), ("batch_fn", 0.5)]
)
def test_a_script_of_another_batch_structure_and_loss_trains_outside_the_repository(
    exported: dict[str, tuple[str, str]], workload: str, chance: float
):
    text, output = exported[workload]
    if workload == "text":
        assert 'return (), dict(batch), batch["labels"]' in text  # labels go to the model
        assert "return model_loss\n" in text  # the model computes it: the trials' model_loss
    elif workload == "batch_fn":  # the user's function splits the batch, in the script too
        assert "from triple_workload import by_name" in text
        assert "args, kwargs, target = by_name(batch)" in text
    else:
        assert "return (batch[0], batch[1]), {}, batch[2]" in text
        assert "from triple_workload import smoothed" in text
        assert "channels_last=True" in text  # the image input goes NHWC, the vector cannot
    ast.parse(text)
    accuracy = float(output.split("val accuracy ")[-1].split()[0])
    assert chance + 0.2 < accuracy <= 1.0, output  # it learned, and was scored right
