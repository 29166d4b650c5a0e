"""The training loop: accumulation, precision, compile, evaluation, timing and faults."""

from __future__ import annotations

import dataclasses
import itertools
import os
import tempfile
import time
from typing import Any

import pytest
import torch
from torch import nn
from torch._inductor.utils import fresh_inductor_cache

from autotune.faults import TrialFault
from autotune.machine import ranks
from autotune.results import Evaluation
from autotune.testing import blobs, blobs_workload, make_config, never_stop, tiny_mlp
from autotune.training.runner import make_plan, train, train_loader
from autotune.workloads import Workload


def test_trains_evaluates_and_measures():
    seen: list[Evaluation] = []
    config = make_config(epochs=2, eval_every=0.5, batch_size=16)
    result = train(config, blobs_workload(), lambda e: seen.append(e) or False)
    assert [e.index for e in seen] == [1, 2, 3, 4]
    assert [e.final for e in seen] == [False, False, False, True]
    assert [e.epoch for e in seen] == [0.5, 1.0, 1.5, 2.0]
    assert [e.optimizer_steps for e in seen] == [8, 16, 24, 32]  # 256 samples / 16 per step
    assert all(a.train_seconds < b.train_seconds for a, b in itertools.pairwise(seen))
    assert result.evaluations == tuple(seen)
    assert result.score == seen[-1].score > 0.9  # blobs are easy
    assert result.samples_seen == 512 and result.optimizer_steps == 32
    assert result.samples_per_second > 0 and result.train_seconds > 0
    assert 0 <= result.overhead_seconds <= result.warmup_seconds <= result.train_seconds
    assert result.compiled_graphs == 0 and result.loss_scale is None
    assert result.peak_memory_bytes > 0 and result.torch_version == torch.__version__


def test_reporter_can_stop_the_trial():
    result = train(make_config(epochs=3), blobs_workload(), lambda e: True)
    assert len(result.evaluations) == 1 and result.evaluations[0].epoch == 1.0


def test_evaluation_time_is_not_training_time():
    # every validation sample takes 5 ms: 64 samples x 3 evaluations >= 0.96 s of evaluation
    workload = blobs_workload(n_val=64, val_delay_seconds=0.005)
    started = time.perf_counter()
    result = train(make_config(epochs=3, batch_size=64), workload, never_stop)
    wall_seconds = time.perf_counter() - started
    eval_seconds = sum(e.eval_seconds for e in result.evaluations)
    assert eval_seconds >= 3 * 64 * 0.005
    # disjoint spans inside one call: had the training clock run through an evaluation, the
    # two would sum to more than the call took, whatever the machine's load
    assert result.train_seconds > 0
    assert result.train_seconds + eval_seconds <= wall_seconds


def test_gradient_accumulation_matches_one_big_batch():
    """Two micro-batches of 16 with accumulation give the step one batch of 32 gives."""
    models: dict[str, list[nn.Module]] = {"big": [], "accumulated": []}
    common = dict(epochs=1, optimizer="sgd", momentum=0.0, lr=0.5, seed=3)
    for name, changes in [
        ("big", dict(batch_size=32, accumulation_steps=1)),
        ("accumulated", dict(batch_size=16, accumulation_steps=2)),
    ]:
        workload = blobs_workload(keep=models[name], n_train=32)
        result = train(make_config(**common, **changes), workload, never_stop)
        assert result.optimizer_steps == 1
    big, accumulated = models["big"][0], models["accumulated"][0]
    initial = blobs_workload(keep=None, n_train=32)
    torch.manual_seed(3)
    start = initial.build_model()
    moved = False
    for p_big, p_acc, p_start in zip(
        big.parameters(), accumulated.parameters(), start.parameters(), strict=True
    ):
        torch.testing.assert_close(p_big, p_acc, rtol=1e-5, atol=1e-6)
        moved |= not torch.allclose(p_big, p_start)
    assert moved, "the optimizer step changed nothing: the comparison would prove nothing"


def test_same_seed_same_trial_other_seed_other_trial():
    workload = blobs_workload()
    runs = [train(make_config(seed=seed), workload, never_stop) for seed in (7, 7, 8)]
    losses = [[e.train_loss for e in r.evaluations] for r in runs]
    assert losses[0] == losses[1]
    assert losses[0] != losses[2]


def test_fp16_trains_through_the_grad_scaler():
    result = train(make_config(precision="fp16"), blobs_workload(), never_stop)
    assert result.loss_scale is not None and result.loss_scale > 0
    assert result.score > 0.9
    bf16 = train(make_config(precision="bf16"), blobs_workload(), never_stop)
    assert bf16.loss_scale is None and bf16.score > 0.9


def test_channels_last_and_workers_train():
    workload = blobs_workload(image=True)  # (1, 4, 4) images
    config = make_config(
        channels_last=True, num_workers=2, prefetch_factor=2, persistent_workers=True
    )
    result = train(config, workload, never_stop)
    assert result.score > 0.9


class _SlowToStart(torch.utils.data.Dataset):
    """A data set whose every DataLoader worker process waits ``seconds`` before its first
    sample: a non-persistent DataLoader pays that again at every epoch's start."""

    def __init__(self, samples: Any, seconds: float) -> None:
        self.samples, self.seconds, self.started_in = samples, seconds, os.getpid()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        if os.getpid() != self.started_in:  # a worker's first sample
            self.started_in = os.getpid()
            time.sleep(self.seconds)
        return self.samples[index]


def test_an_epochs_start_is_counted_once_per_epoch_not_as_one_time_overhead():
    """Non-persistent workers start again every epoch (0.6 s each here): a full run pays that
    per epoch, so the trial's one-time overhead holds none of it, and its steady samples/s
    counts one start per epoch trained, though its steady window (from the middle of the first
    epoch: 2.5 epochs) holds only two."""
    workload = blobs_workload(n_train=256)
    workload = dataclasses.replace(workload, train_set=_SlowToStart(workload.train_set, 0.6))
    config = make_config(epochs=3, eval_every=1, batch_size=64, num_workers=1, prefetch_factor=2)
    result = train(config, workload, never_stop)
    assert result.overhead_seconds < 0.3  # was the first start, about 0.6 s
    epoch_seconds = 256 / result.samples_per_second
    assert epoch_seconds >= 0.6  # each epoch's start in it: was 0.48 s (1.2 s over 2.5 epochs)


@pytest.mark.slow
def test_compile_really_compiles_and_every_trial_pays_a_cold_compile():
    config = make_config(compile="default", epochs=1)
    first = train(config, blobs_workload(), never_stop)
    assert first.compiled_graphs >= 1
    # the same trial again: no graph or kernel cached by the first may make it cheaper (warm
    # caches cut this to ~0.1 s); forward and backward compiles both count
    inductor = torch._dynamo.utils.counters["inductor"]  # private, but the only witness
    hits, misses = inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"]
    again = train(config, blobs_workload(), never_stop)
    assert again.compiled_graphs >= 1
    # Inductor looked its graphs up and compiled them: no cache of the first trial was found
    assert inductor["fxgraph_cache_miss"] > misses
    assert inductor["fxgraph_cache_hit"] == hits
    assert again.compile_seconds > 0 and again.overhead_seconds > 0  # charged to the trial
    assert first.score > 0.8 and again.score == first.score

    # the oracle can fail: the same function compiled twice in one warm cache is a hit
    with tempfile.TemporaryDirectory() as scratch, fresh_inductor_cache(dir=scratch):
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(lambda x: (x * 2).sin().sum())(torch.randn(8))
    assert inductor["fxgraph_cache_hit"] > hits


def test_nonfinite_loss_is_a_named_fault():
    splits = blobs()
    shape = tuple(splits.train[0][0].shape)
    workload = Workload(
        "nan",
        splits.train,
        splits.val,
        4,
        shape,
        lambda: tiny_mlp(4, shape, nan_after_steps=3),
    )
    with pytest.raises(TrialFault) as caught:
        train(make_config(), workload, never_stop)
    assert caught.value.kind == "nonfinite_loss"
    assert "training loss is nan" in caught.value.message


def test_labels_past_the_logits_are_the_trials_error_and_the_next_trial_trains():
    """A loss that indexes past the logits is a kernel fault: on a GPU a device-side assert
    that breaks the CUDA context (tests/test_gpu.py), here an IndexError. Either is the
    configuration's error, said in torch's words, not a crash."""
    from autotune.spacefile import WorkloadSpec
    from autotune.workloads import load

    workload = load(
        WorkloadSpec(
            model="autotune.testing:tiny_cnn",
            model_args={"one_logit_at_batch": 16},
            data="shapes",
            data_args={"n_train": 64, "n_val": 32},
        )
    )
    with pytest.raises(TrialFault) as caught:
        train(make_config(batch_size=16), workload, never_stop)
    assert caught.value.kind == "error" and "out of bounds" in caught.value.message
    assert 0.0 <= train(make_config(batch_size=32), workload, never_stop).score <= 1.0


def test_batch_larger_than_the_data_is_an_invalid_config():
    with pytest.raises(TrialFault) as caught:
        train(make_config(batch_size=512), blobs_workload(), never_stop)
    assert caught.value.kind == "invalid_config"
    assert "larger than the training set (256 samples)" in caught.value.message


def test_a_batch_larger_than_a_process_share_says_per_process(monkeypatch):
    """Rank 1 of 2 draws half of every epoch: 200 per process is more than its 128."""
    monkeypatch.setattr(ranks, "rank", lambda: 1)
    with pytest.raises(TrialFault) as caught:
        train_loader(make_config(batch_size=200, world_size=2), blobs_workload())
    assert caught.value.kind == "invalid_config"
    assert caught.value.message == (
        "batch_size 200 (per process) is larger than each of the 2 processes' share of the "
        "training set (128 of 256 samples)"
    )


def test_plan_lays_out_steps_evaluations_and_warmup():
    plan = make_plan(make_config(epochs=2, eval_every=0.5, accumulation_steps=2), 20)
    assert plan.optimizer_steps == 20
    assert plan.eval_steps == (5, 10, 15, 20)
    assert plan.warmup_steps == 2
    fractional = make_plan(make_config(epochs=1.5, eval_every=1.0), 10)
    assert fractional.optimizer_steps == 15 and fractional.eval_steps == (10, 15)
    with pytest.raises(TrialFault, match="needs 4 micro-batches per step"):
        make_plan(make_config(epochs=1, accumulation_steps=4), 3)


class _DeviceCount:
    """A token count as a device tensor behaves for the loop: adding is free, but reading it
    (``bool``, as ``count or 0`` does) would wait for the device, so here it fails."""

    def __init__(self, count: torch.Tensor | int) -> None:
        self.count = count

    def __bool__(self) -> bool:
        raise AssertionError("the token count was read back inside the training loop")

    def __radd__(self, other: object) -> _DeviceCount:
        total = other.count if isinstance(other, _DeviceCount) else other
        return _DeviceCount(total + self.count)  # type: ignore[operator]

    __add__ = __radd__

    def __float__(self) -> float:
        return float(self.count)


class _MeanEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(dim=1))


def test_counting_tokens_reads_nothing_back_in_the_loop(monkeypatch: pytest.MonkeyPatch):
    from torch.utils.data import TensorDataset

    from autotune.training import losses

    ids = torch.randint(0, 20, (128, 6))
    data = TensorDataset(ids, (ids[:, 0] > 9).long())
    workload = Workload("tokens", data, data, 2, (6,), _MeanEmbedding)
    assert workload.counts_tokens
    counted = losses.count_tokens  # where the loop's losses count them
    monkeypatch.setattr(losses, "count_tokens", lambda inputs: _DeviceCount(counted(inputs)))
    result = train(make_config(batch_size=16, epochs=1.0), workload, never_stop)
    assert result.tokens_per_second == pytest.approx(6 * result.samples_per_second)


def test_under_cuda_graphs_gradients_live_outside_the_graphs_pool():
    """The trainer of a CUDA-graph compile mode allocates every gradient before the first
    backward and zeroes them in place (the same tensors, accumulated into), and counting FLOPs
    keeps them; other modes free them at every step, as before."""
    from autotune.training.telemetry import flops_per_sample
    from autotune.training.trainer import Trainer

    workload = blobs_workload()
    graphs = Trainer(workload.build_model(), make_config(compile="reduce-overhead"), 10)
    grads = [p.grad for p in graphs.model.parameters()]
    assert all(g is not None and not g.any() for g in grads)
    inputs = torch.randn(8, *workload.input_shape)
    flops_per_sample(
        graphs.model,
        lambda: nn.functional.cross_entropy(graphs.model(inputs), torch.zeros(8).long()),
        8,
    )
    graphs.optimizer_step()
    kept = [p.grad for p in graphs.model.parameters()]
    assert all(now is before for now, before in zip(kept, grads, strict=True))  # zeroed in place
    assert all(not p.grad.any() for p in graphs.model.parameters())
    eager = Trainer(workload.build_model(), make_config(), 10)
    assert all(p.grad is None for p in eager.model.parameters())
