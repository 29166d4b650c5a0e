"""The data pipelines: how training and validation batches reach the device.

Two pipelines apply exactly the same augmentation (a random crop of the image padded by
``CROP_PADDING`` pixels, a horizontal flip half the time, then normalisation, as CIFAR-10
training records do it):

- ``dataloader``: a ``torch.utils.data.DataLoader`` with the trial's knobs (workers, pinned
  memory, prefetching); an ``ImageTensorDataset`` augments one sample at a time in its workers,
  so the DataLoader knobs matter as they do in real training;
- ``device``: ``DeviceBatches`` keeps the whole in-memory training set as one tensor on the
  training device, draws shuffled batches by index and augments each batch at once.

How a run's loaders are made is said once, in functions of plain values (``train_batches``,
``val_batches``, ``device_train_batches``, ``device_val_batches``): the trials call them with
a TrialConfig's fields (``make_train_loader``, ``make_val_loader``), and exported scripts,
which carry them pasted, with their constants. Everything but those two depends only on torch
and NumPy: ``autotune export`` copies this source into standalone training scripts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from autotune.config import TrialConfig

Collate = Callable[[list[Any]], Any]  # samples -> one batch, as DataLoader's collate_fn

CROP_PADDING = 4  # pixels of zero padding around the image before the random crop


def crop_and_flip(image: torch.Tensor) -> torch.Tensor:
    """One image (C, H, W), cropped at random from it padded with zeros, flipped half the time."""
    height, width = image.shape[1:]
    padded = nn.functional.pad(image, (CROP_PADDING,) * 4)
    top, left = torch.randint(0, 2 * CROP_PADDING + 1, (2,)).tolist()
    image = padded[:, top : top + height, left : left + width]
    return image.flip(-1) if torch.rand(()) < 0.5 else image


class ImageTensorDataset(Dataset):
    """uint8 images (N, C, H, W) and labels in memory, augmented (``crop_and_flip``) when
    ``augment``, scaled to [0, 1] and normalised one sample at a time."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        augment: bool,
        classes: tuple[str, ...] = (),
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(
                f"images must be uint8 (N, C, H, W), got {images.dtype} {images.shape}"
            )
        self.images, self.labels = images, labels.long()
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)
        self.augment = augment
        self.classes = classes

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if self.augment:
            image = crop_and_flip(image)
        return (image.float() / 255 - self.mean) / self.std, self.labels[index]


class DeviceBatches:
    """Shuffled (or ordered) batches of an in-memory data set, made on ``device`` in bulk.

    The whole data set is copied to ``device`` once, when the first pass starts (so that a timed
    training run pays for it); an ImageTensorDataset's batches are augmented as one tensor
    operation. Shuffled, the last partial batch is dropped (static shapes); in order, none is.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        device: torch.device,
        generator: torch.Generator | None = None,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.mean: torch.Tensor | None
        self.std: torch.Tensor | None
        if isinstance(dataset, ImageTensorDataset):
            self.inputs, self.labels = dataset.images, dataset.labels
            self.mean, self.std = dataset.mean, dataset.std
            self.augment = dataset.augment
        elif isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
            self.inputs, self.labels = dataset.tensors
            self.mean = self.std = None
            self.augment = False
        else:
            raise TypeError(
                f"the device pipeline needs an in-memory data set (ImageTensorDataset or "
                f"TensorDataset), not {type(dataset).__name__}"
            )
        self.batch_size, self.device, self.shuffle = batch_size, device, shuffle
        # one process of a distributed trial: every rank draws the same order (the same seed)
        # and takes its own equal slice of it, as DistributedSampler does
        self.rank, self.world_size = rank, world_size
        self.generator = generator or torch.Generator(device=device)

    def __len__(self) -> int:
        count = self.inputs.shape[0] // self.world_size
        return count // self.batch_size if self.shuffle else math.ceil(count / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.inputs.device != self.device:  # the first pass: the data set moves over
            self.inputs, self.labels = self.inputs.to(self.device), self.labels.to(self.device)
            if self.mean is not None and self.std is not None:
                self.mean, self.std = self.mean.to(self.device), self.std.to(self.device)
        count = self.inputs.shape[0]
        if self.shuffle:
            order = torch.randperm(count, device=self.device, generator=self.generator)
            share = count // self.world_size
            order = order[self.rank * share : (self.rank + 1) * share]
            stop = len(self) * self.batch_size
        else:
            order, stop = torch.arange(count, device=self.device), count
        for start in range(0, stop, self.batch_size):
            index = order[start : start + self.batch_size]
            yield self._prepare(self.inputs[index]), self.labels[index]

    def _prepare(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.mean is None:
            return inputs
        if self.augment:
            batch, _, height, width = inputs.shape
            padded = nn.functional.pad(inputs, (CROP_PADDING,) * 4)
            shifts = torch.randint(
                0, 2 * CROP_PADDING + 1, (2, batch), device=self.device, generator=self.generator
            )
            rows = (shifts[0, :, None] + torch.arange(height, device=self.device))[:, :, None]
            cols = (shifts[1, :, None] + torch.arange(width, device=self.device))[:, None, :]
            flip = torch.rand(batch, device=self.device, generator=self.generator) < 0.5
            cols = torch.where(flip[:, None, None], cols.flip(-1), cols)
            samples = torch.arange(batch, device=self.device)[:, None, None]
            # gathered channels-last; made contiguous so that channels_last stays its own knob
            inputs = padded.permute(0, 2, 3, 1)[samples, rows, cols].permute(0, 3, 1, 2)
            inputs = inputs.contiguous()
        assert self.std is not None  # set together with mean
        return (inputs.float() / 255 - self.mean) / self.std


def _seed_worker(worker_id: int) -> None:
    """Seed Python and NumPy in a DataLoader worker from the seed torch gave it."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


class EpochSampler(DistributedSampler):
    """A DistributedSampler that moves on to the next epoch's order at every pass (a training
    loop iterates its loader once per epoch); every rank shuffles with the same seed."""

    def __iter__(self) -> Iterator[Any]:
        order = super().__iter__()  # drawn now, from seed + epoch
        self.set_epoch(self.epoch + 1)
        return order


def train_batches(
    dataset: Dataset,
    batch_size: int,
    seed: int,
    *,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    timeout: float = 0.0,
    collate_fn: Collate | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """Shuffled training batches of ``batch_size`` samples from a DataLoader, the last partial
    one dropped (static shapes: no recompilation, CUDA graphs stay valid), every draw from
    ``seed``: the order, and each worker's torch, NumPy and Python random streams. Process
    ``rank`` of ``world_size`` draws its own share of every epoch (each pass over the loader
    is the next epoch). The worker knobs apply only with workers; ``timeout``: seconds a worker
    may take for a batch (0: no limit). The trials and the exported scripts call it."""
    workers = num_workers > 0
    sampler = (
        EpochSampler(dataset, num_replicas=world_size, rank=rank, seed=seed, drop_last=True)
        if world_size > 1
        else None
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed),
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=persistent_workers if workers else False,
        worker_init_fn=_seed_worker if workers else None,
        timeout=timeout if workers else 0,
        collate_fn=collate_fn,
    )


def val_batches(
    dataset: Dataset,
    batch_size: int,
    pin_memory: bool = False,
    collate_fn: Collate | None = None,
) -> DataLoader:
    """Validation batches of ``batch_size`` samples from a DataLoader, in order, every sample
    once. The trials and the exported scripts call it."""
    return DataLoader(dataset, batch_size=batch_size, pin_memory=pin_memory, collate_fn=collate_fn)


def device_train_batches(
    dataset: Dataset,
    batch_size: int,
    device: torch.device,
    seed: int,
    rank: int = 0,
    world: int = 1,
) -> DeviceBatches:
    """The device pipeline's shuffled training batches (``DeviceBatches``), every draw (the
    order, the augmentation) from ``seed``; process ``rank`` of ``world`` trains its own share.
    The trials and the exported scripts call it."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return DeviceBatches(dataset, batch_size, device, generator, True, rank, world)


def device_val_batches(
    dataset: Dataset, batch_size: int, device: torch.device, collate_fn: Collate | None = None
) -> DeviceBatches | DataLoader:
    """The device pipeline's validation batches, in order: on the device when the data set is
    in memory, else ``val_batches``. The trials and the exported scripts call it."""
    try:
        return DeviceBatches(dataset, batch_size, device, shuffle=False)
    except TypeError:  # not in memory: a DataLoader serves it
        return val_batches(dataset, batch_size, collate_fn=collate_fn)


def make_train_loader(
    dataset: Dataset,
    config: TrialConfig,
    seed: int,
    collate_fn: Collate | None = None,
    rank: int = 0,
) -> DataLoader | DeviceBatches:
    """The training batches of the trial's pipeline and knobs (``train_batches``,
    ``device_train_batches``); process ``rank`` of a distributed trial draws its own share."""
    if config.data_pipeline == "device":
        device = torch.device(config.device)
        return device_train_batches(
            dataset, config.batch_size, device, seed, rank, config.world_size
        )
    return train_batches(
        dataset,
        config.batch_size,
        seed,
        num_workers=config.num_workers,
        pin_memory=config.pin_memory,
        prefetch_factor=config.prefetch_factor,
        persistent_workers=config.persistent_workers,
        timeout=config.dataloader_timeout,
        collate_fn=collate_fn,
        rank=rank,
        world_size=config.world_size,
    )


def make_val_loader(
    dataset: Dataset, config: TrialConfig, collate_fn: Collate | None = None
) -> DataLoader | DeviceBatches:
    """The validation batches of the trial's pipeline (``val_batches``,
    ``device_val_batches``)."""
    if config.data_pipeline == "device":
        return device_val_batches(
            dataset, config.val_batch_size, torch.device(config.device), collate_fn
        )
    return val_batches(dataset, config.val_batch_size, config.pin_memory, collate_fn)
