"""Batches of any structure (pairs, longer tuples, nested tuples, Hugging Face style dicts) and
the loss the user chooses (cross-entropy, the model's own, a function of theirs), trained for
real by the runner."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch

from autotune.machine.hardware import detect
from autotune.search.space import restrict
from autotune.spacefile import Spec, WorkloadSpec, parse_spec
from autotune.testing import make_config, never_stop
from autotune.training.runner import train
from autotune.workloads import WorkloadError, load
from autotune.workloads.batches import BatchLayout, ModelInputs, to_device

# Written as a user would: token sequences whose class is the most frequent token among the
# first three ids, padded to a length with an attention mask, as a tokenizer gives them.
USER_MODULE = textwrap.dedent(
    """
    from dataclasses import dataclass

    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from autotune.workloads import DataSplits

    CLASSES, VOCAB, LENGTH = 3, 12, 10

    class Tokens(Dataset):
        classes = ("low", "middle", "high")

        def __init__(self, n, seed, style):
            g = torch.Generator().manual_seed(seed)
            self.ids = torch.randint(CLASSES, VOCAB, (n, LENGTH), generator=g)
            self.labels = torch.randint(0, CLASSES, (n,), generator=g)
            self.ids[:, :4] = self.labels[:, None]  # the class shows in the first tokens
            self.lengths = torch.randint(5, LENGTH + 1, (n,), generator=g)
            self.style = style

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            mask = (torch.arange(LENGTH) < self.lengths[i]).long()
            ids = self.ids[i] * mask
            label = int(self.labels[i])
            if self.style == "dict":
                return {"input_ids": ids, "attention_mask": mask, "labels": label}
            if self.style == "triple":
                return ids, mask, label
            if self.style == "ids":
                return ids, label
            return (ids, mask), label  # nested: the input is itself a pair

    def tokens(style="dict", n=192):
        return Tokens(n, 0, style), Tokens(120, 1, style)

    def pad(samples):  # variable-length sequences padded per batch, as a collator does
        longest = max(len(sample["input_ids"]) for sample in samples)
        ids = torch.zeros(len(samples), longest, dtype=torch.long)
        for row, sample in enumerate(samples):
            ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        labels = torch.tensor([sample["labels"] for sample in samples])
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}

    class Ragged(Tokens):
        def __getitem__(self, i):
            return {"input_ids": self.ids[i, : self.lengths[i]], "labels": int(self.labels[i])}

    def unpadded():
        return Ragged(192, 0, "dict"), Ragged(120, 1, "dict")

    def ragged():
        return DataSplits(Ragged(192, 0, "dict"), Ragged(120, 1, "dict"), collate_fn=pad)

    @dataclass
    class Output:  # what a Hugging Face model returns: a ModelOutput with .loss and .logits
        logits: torch.Tensor
        loss: torch.Tensor | None = None

    class Classifier(nn.Module):
        def __init__(self, num_classes=CLASSES, width=16):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, width)
            self.head = nn.Linear(width, num_classes)

        def forward(self, input_ids, attention_mask, labels=None):
            mask = attention_mask.unsqueeze(-1).float()
            pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
            logits = self.head(pooled)
            loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
            return Output(logits=logits, loss=loss)

    def hf_style(num_classes):
        return Classifier(num_classes)

    class PairInput(Classifier):
        def forward(self, pair):
            return super().forward(*pair).logits

    def pair_input(num_classes):
        return PairInput(num_classes)

    class LogitsOnly(Classifier):
        def forward(self, input_ids, attention_mask, labels=None):
            return super().forward(input_ids, attention_mask).logits

    def logits_only(num_classes):
        return LogitsOnly(num_classes)

    class IdsOnly(Classifier):
        def forward(self, input_ids):
            return super().forward(input_ids, (input_ids != 0).long()).logits

    def ids_only(num_classes):
        return IdsOnly(num_classes)

    def smoothed(output, target):
        return nn.functional.cross_entropy(output.logits, target, label_smoothing=0.1)

    def per_sample(output, target):
        return nn.functional.cross_entropy(output.logits, target, reduction="none")

    def by_keyword(batch):  # ((ids, mask), label): the pair becomes keyword arguments
        (ids, mask), label = batch
        return (), {"input_ids": ids, "attention_mask": mask}, label

    def two_things(batch):
        return batch[0], batch[1]

    def misreads(batch):
        return batch["input_ids"]
    """
)


@pytest.fixture
def user_dir(user_module) -> Path:
    return user_module("token_workloads", USER_MODULE)


def _load(folder: Path, model: str, style: str, **workload: object):
    spec = WorkloadSpec(
        model=f"token_workloads:{model}",
        data="token_workloads:tokens",
        data_args={"style": style},
        **workload,  # type: ignore[arg-type]
    )
    return load(spec, base_dir=folder)


@pytest.mark.parametrize(
    ("model", "style", "workload"),
    [
        ("hf_style", "dict", {"loss": "model"}),  # labels passed to the model, its loss used
        ("hf_style", "dict", {}),  # cross-entropy on .logits; the model never sees the labels
        ("hf_style", "triple", {"target": 2}),  # inputs 0 and 1, positionally
        ("pair_input", "nested", {}),  # ((ids, mask), label): the model gets the pair
        ("hf_style", "dict", {"loss": "token_workloads:smoothed"}),
        ("logits_only", "nested", {"batch_fn": "token_workloads:by_keyword"}),
    ],
)
def test_every_batch_structure_and_loss_trains_and_is_scored(
    user_dir: Path, model: str, style: str, workload: dict
):
    loaded = _load(user_dir, model, style, **workload)
    assert loaded.num_classes == 3  # from the data set's classes
    result = train(make_config(epochs=3, lr=0.05, batch_size=16), loaded, never_stop)
    assert 0.7 < result.score <= 1.0  # chance is 1/3: it learned, and was scored right
    first, last = result.evaluations[0], result.evaluations[-1]
    assert last.train_loss < first.train_loss or last.score > first.score
    assert result.flops_per_sample and result.flops_per_sample > 0


def test_a_data_function_may_batch_its_samples_with_its_own_collate_fn(user_dir: Path):
    spec = WorkloadSpec(model="token_workloads:hf_style", data="token_workloads:ragged")
    loaded = load(spec, base_dir=user_dir)
    result = train(make_config(epochs=3, lr=0.05, batch_size=16), loaded, never_stop)
    assert 0.7 < result.score <= 1.0
    space = parse_spec(
        "workload: {model: mlp, data: digits}\nspace: {data_pipeline: [dataloader, device]}\n",
        "s.yaml",
    ).space
    restricted = restrict(Spec(workload=spec, space=space), detect("cpu"), loaded)
    assert restricted.spec.space.data_pipeline.values == ("dataloader",)
    assert "collate_fn batches samples in a DataLoader" in restricted.dropped[0].reason
    # without it, samples of different lengths cannot be stacked: one line says what to do
    with pytest.raises(WorkloadError, match=r"cannot be stacked .* DataSplits\(\.\.\., coll"):
        load(WorkloadSpec(model="token_workloads:hf_style", data="token_workloads:unpadded"),
             base_dir=user_dir)  # fmt: skip


def test_token_throughput_counts_the_tokens_a_batch_holds(user_dir: Path):
    config = make_config(epochs=1, lr=0.05, batch_size=16)
    masked = train(config, _load(user_dir, "hf_style", "dict"), never_stop)
    assert masked.tokens_per_second is not None
    per_sample = masked.tokens_per_second / masked.samples_per_second
    assert 5 <= per_sample < 9  # sequences of 5 to 10 tokens in 10 places: padding not counted
    ids = train(config, _load(user_dir, "ids_only", "ids"), never_stop)
    assert ids.tokens_per_second == pytest.approx(10 * ids.samples_per_second)  # no mask
    two_inputs = train(config, _load(user_dir, "hf_style", "triple", target=2), never_stop)
    assert two_inputs.tokens_per_second is None  # which input is the mask is not said


def test_dict_layouts_pass_the_labels_to_the_model_only_for_its_own_loss(user_dir: Path):
    cross_entropy = _load(user_dir, "hf_style", "dict").layout
    own_loss = _load(user_dir, "hf_style", "dict", loss="model").layout
    batch = {"input_ids": 1, "attention_mask": 2, "labels": 3}
    assert cross_entropy.split(batch) == (
        ModelInputs((), {"input_ids": 1, "attention_mask": 2}),
        3,
    )
    assert own_loss.split(batch) == (
        ModelInputs((), {"input_ids": 1, "attention_mask": 2, "labels": 3}),
        3,
    )
    explicit = BatchLayout.of(batch, ["input_ids"], "labels", False)
    assert explicit.split(batch) == (ModelInputs((), {"input_ids": 1}), 3)
    assert BatchLayout.of((1, 2, 3), None, 0, False).split((1, 2, 3)) == (
        ModelInputs((2, 3), {}),
        1,
    )


@pytest.mark.parametrize(
    ("model", "style", "workload", "expected"),
    [
        (
            "hf_style",
            "dict",
            {"target": "label"},
            "a sample has no key 'label'; it has 'input_ids'",
        ),
        ("hf_style", "triple", {}, r"a sample is a tuple of 3: set workload\.target"),
        ("hf_style", "triple", {"target": 5}, r"5 is not an index of it \(0 to 2\)"),
        (
            "logits_only",
            "dict",
            {"loss": "model"},
            r"loss 'model' fails on a training batch .*returned Tensor without a 'loss' entry",
        ),
        (
            "pair_input",
            "nested",
            {"loss": "model"},  # the labels go to a model that takes none
            r"fails on a training batch \(list of .*\): TypeError: .*forward\(\) takes 2 "
            r"positional arguments but 3 were given$",
        ),
        (
            "hf_style",
            "dict",
            {"loss": "token_workloads:per_sample"},
            r"loss 'token_workloads:per_sample' returned float32 \[2\]; it must be one number",
        ),
        (
            "hf_style",
            "dict",
            {"loss": "token_workloads:nowhere"},
            r"loss 'token_workloads:nowhere': token_workloads \(\S+token_workloads.py\) has no "
            "attribute 'nowhere'",
        ),
        (
            "hf_style",
            "nested",
            {"batch_fn": "token_workloads:two_things"},
            r"^batch_fn 'token_workloads:two_things' returned tuple of 2; it must return "
            r"\(model_args, model_kwargs, target\)$",
        ),
        (
            "hf_style",
            "nested",
            {"batch_fn": "token_workloads:misreads"},
            r"^batch_fn 'token_workloads:misreads' raised TypeError: .* \(at "
            r".*token_workloads\.py:\d+ in misreads\)$",
        ),
    ],
)
def test_a_layout_or_loss_that_does_not_fit_the_data_is_one_line(
    user_dir: Path, model: str, style: str, workload: dict, expected: str
):
    with pytest.raises(WorkloadError) as caught:
        _load(user_dir, model, style, **workload)
    message = str(caught.value)
    assert re.search(expected, message), message
    assert "\n" not in message


def test_every_tensor_of_a_nested_batch_reaches_the_device_and_images_go_nhwc():
    batch = (
        ModelInputs((torch.zeros(2, 3, 4, 4), [torch.zeros(2, 5)]), {"m": torch.ones(2, 5)}),
        {"y": torch.zeros(2, dtype=torch.long)},
    )
    moved = to_device(batch, torch.device("meta"), channels_last=True)
    inputs, targets = moved
    assert isinstance(inputs, ModelInputs)
    assert inputs.args[0].device.type == "meta"
    assert inputs.args[0].is_contiguous(memory_format=torch.channels_last)
    assert inputs.args[1][0].device.type == "meta" and inputs.kwargs["m"].device.type == "meta"
    assert targets["y"].device.type == "meta" and targets["y"].dtype == torch.long


def test_flat_batches_reach_the_device_as_nested_ones_do():
    """A lone tensor and model inputs of tensors take a path of their own (no tree walked at
    every step): the same devices, layout and types as the tree's."""
    meta = torch.device("meta")
    image, mask = torch.zeros(2, 3, 4, 4), torch.ones(2, 5, dtype=torch.long)
    alone = to_device(image, meta, channels_last=True)
    assert alone.device.type == "meta"
    assert alone.is_contiguous(memory_format=torch.channels_last)
    flat = to_device(ModelInputs((image,), {"attention_mask": mask}), meta, channels_last=True)
    assert isinstance(flat, ModelInputs) and flat.args[0].device.type == "meta"
    assert flat.args[0].is_contiguous(memory_format=torch.channels_last)
    assert flat.kwargs["attention_mask"].device.type == "meta"
    assert flat.kwargs["attention_mask"].dtype == torch.long
    assert not to_device(image, meta).is_contiguous(memory_format=torch.channels_last)


def test_a_batch_fn_replaces_inputs_and_target(user_dir: Path):
    with pytest.raises(ValueError, match="batch_fn: it says where the inputs and the target are"):
        WorkloadSpec(model="m", data="d", batch_fn="token_workloads:by_keyword", target=1)
    loaded = _load(user_dir, "logits_only", "nested", batch_fn="token_workloads:by_keyword")
    inputs, target = loaded.example_batch(4)
    assert set(inputs.kwargs) == {"input_ids", "attention_mask"} and inputs.args == ()
    assert target.shape == (4,) and loaded.counts_tokens  # an attention mask: tokens counted
    record = loaded.layout.to_record()
    assert record["batch_fn"] == "token_workloads:by_keyword"
    assert BatchLayout.from_record(record).batch_fn_name == "token_workloads:by_keyword"
