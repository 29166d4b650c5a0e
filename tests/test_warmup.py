"""What a fresh process pays once is paid before the first trial's clock, and changes nothing
a trial measures or learns."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.data import TensorDataset

from autotune.executor import InProcessExecutor
from autotune.testing import blobs_workload, make_config, never_stop
from autotune.training import timing
from autotune.training.runner import train
from autotune.training.warmup import Warmth, warm_process
from autotune.workloads import Workload
from autotune.workloads.scoring import cross_entropy_classes_last


@pytest.fixture
def clock_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Events in order: each warm-up, and each time a trial's training clock starts."""
    events: list[str] = []
    start = timing.TrainClock.start

    def logged_start(self: timing.TrainClock) -> None:
        if self._total == 0.0:  # the first start of a trial's clock (resumes add to a total)
            events.append("clock")
        start(self)

    monkeypatch.setattr(timing.TrainClock, "start", logged_start)
    return events


@pytest.mark.slow
def test_a_fresh_process_warms_before_the_first_clock_and_the_compiler_before_compiling(
    clock_starts: list[str],
):
    workload = blobs_workload()
    executor = InProcessExecutor(workload, Warmth(log=clock_starts.append))
    eager = make_config(epochs=1)
    executor.train(eager, never_stop)
    executor.train(eager, never_stop)
    executor.train(eager.replace(compile="default"), never_stop)
    executor.train(eager.replace(compile="default"), never_stop)
    # once each, and each before the clock of the first trial that needs it
    assert clock_starts == ["process", "clock", "clock", "compiler", "clock", "clock"]


def test_a_warm_up_changes_nothing_a_trial_learns():
    workload = blobs_workload()
    config = make_config(epochs=1, eval_every=0.5, batch_size=16)
    cold = train(config, workload, never_stop)
    warm_process(config.replace(seed=7, batch_size=32), workload)  # another config, even
    warm = train(config, workload, never_stop)
    assert [e.score for e in warm.evaluations] == [e.score for e in cold.evaluations]
    assert [e.train_loss for e in warm.evaluations] == [e.train_loss for e in cold.evaluations]
    assert warm.samples_seen == cold.samples_seen


def test_a_configuration_with_nothing_to_train_leaves_the_warm_up_to_the_next_trial():
    workload = blobs_workload()
    events: list[str] = []
    warmth = Warmth(log=events.append)
    warmth.warm_for(make_config(batch_size=100_000), workload)  # more than the data set
    assert not warmth.process_warm and events == []
    warmth.warm_for(make_config(), workload)
    assert warmth.process_warm and events == ["process"]


def test_a_warm_process_keeps_its_objects_out_of_collections_until_it_closes():
    import gc

    executor = InProcessExecutor(blobs_workload())
    frozen = gc.get_freeze_count()  # what the suite froze after the tests before (conftest)
    try:
        executor.train(make_config(epochs=1.0), never_stop)
        # torch's objects are not walked after every trial
        assert gc.get_freeze_count() > frozen
    finally:
        executor.close()
    assert gc.get_freeze_count() == 0  # ... and are collected at exit again (SQLite's WAL)


class _TokenModel(torch.nn.Module):
    """A causal-LM-like model: token ids [batch, length] -> logits [batch, length, vocab]."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def _workload(inputs, targets, model, loss) -> Workload:
    data = TensorDataset(inputs, targets)
    shape = tuple(inputs.shape[1:])
    return Workload("own", data, data, None, shape, model, loss_fn=loss)


@pytest.mark.parametrize("kind", ["regression", "classes_last"])
def test_the_warm_up_trains_the_studys_own_loss_and_layout(kind: str):
    """A regression with float targets [n] and its own loss, and logits with the classes last
    ([batch, length, vocab]): cross-entropy on class-first logits fails on both."""
    if kind == "regression":
        inputs = torch.randn(64, 4)
        workload = _workload(
            inputs, inputs.sum(dim=1), lambda: _Squeeze(torch.nn.Linear(4, 1)), _mse
        )
    else:
        tokens = torch.randint(0, 11, (64, 6))
        workload = _workload(
            tokens, tokens.roll(-1, dims=1), _TokenModel, cross_entropy_classes_last
        )
    losses: list[torch.Tensor] = []
    recorded = workload.loss_fn

    def spy(output, target):
        loss = recorded(output, target)
        losses.append(loss.detach())
        return loss

    workload = dataclasses.replace(workload, loss_fn=spy)
    assert warm_process(make_config(batch_size=16), workload)
    assert losses and all(torch.isfinite(loss) for loss in losses)


class _Squeeze(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).squeeze(-1)


def _mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target)
