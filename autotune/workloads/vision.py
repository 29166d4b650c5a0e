"""Image workloads: torchvision models, CIFAR-10 and ImageFolder from disk, generated shapes.

Everything here depends only on torch, torchvision, NumPy and ``autotune.pipeline``:
``autotune export`` copies this source into standalone training scripts."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn
from torch.utils.data import Dataset

from autotune.pipeline import ImageTensorDataset, crop_and_flip

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def torchvision_model(
    arch: str, num_classes: int, cifar_stem: bool = False, **kwargs: object
) -> nn.Module:
    """A torchvision classification model with fresh weights (nothing is downloaded).

    ``cifar_stem`` adapts a ResNet-style stem to 32x32 inputs: a 3x3, stride-1 first
    convolution and no max-pool, so the first stage sees 32x32 rather than 8x8 features.
    """
    if kwargs.get("weights") is not None:
        raise ValueError("pretrained weights are not supported: they would be downloaded")
    kwargs.pop("weights", None)
    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **kwargs)
    if cifar_stem:
        if not (
            isinstance(getattr(model, "conv1", None), nn.Conv2d) and hasattr(model, "maxpool")
        ):
            raise ValueError(
                f"cifar_stem adapts ResNet-style models (conv1 and maxpool); {arch} has none"
            )
        model.conv1 = nn.Conv2d(
            model.conv1.in_channels, model.conv1.out_channels, 3, stride=1, padding=1, bias=False
        )
        model.maxpool = nn.Identity()
    return model


def _read_cifar_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One CIFAR-10 batch file; ValueError naming the file when it is not one (truncated,
    corrupt, or another format)."""
    try:
        with open(path, "rb") as stream:
            entry = pickle.load(stream, encoding="latin1")  # the format CIFAR-10 ships in
        images = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = torch.tensor(entry["labels"])
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path} is not a readable CIFAR-10 batch ({type(err).__name__}: {err}); extract "
            f"cifar-10-python.tar.gz again"
        ) from None
    return torch.from_numpy(images.copy()), labels


def cifar10(root: str = "data") -> tuple[ImageTensorDataset, ImageTensorDataset]:
    """CIFAR-10 from its standard Python format: ``root/cifar-10-batches-py/data_batch_1..5``
    and ``test_batch`` (extract ``cifar-10-python.tar.gz`` into ``root``). Nothing is downloaded.
    """
    folder = Path(root).expanduser() / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"no CIFAR-10 at {folder} (missing {', '.join(missing)}): download "
            f"cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and "
            f"extract it into {Path(root).expanduser()}"
        )
    parts = [_read_cifar_batch(folder / name) for name in names[:5]]
    train_images = torch.cat([images for images, _ in parts])
    train_labels = torch.cat([labels for _, labels in parts])
    val_images, val_labels = _read_cifar_batch(folder / "test_batch")
    norm = (CIFAR10_MEAN, CIFAR10_STD)
    return (
        ImageTensorDataset(train_images, train_labels, *norm, True, CIFAR10_CLASSES),
        ImageTensorDataset(val_images, val_labels, *norm, False, CIFAR10_CLASSES),
    )


class _ImageFolderSplit(Dataset):
    """An ImageFolder split, resized to ``size`` squares and augmented like ImageTensorDataset."""

    def __init__(
        self,
        folder: Path,
        size: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        augment: bool,
    ) -> None:
        self.folder = torchvision.datasets.ImageFolder(str(folder))
        self.classes = tuple(self.folder.classes)
        self.size = size
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.folder[index]
        pixels = torchvision.transforms.functional.pil_to_tensor(image.convert("RGB"))
        pixels = torchvision.transforms.functional.resize(
            pixels, [self.size, self.size], antialias=True
        )
        if self.augment:
            pixels = crop_and_flip(pixels)
        return (pixels.float() / 255 - self.mean) / self.std, torch.tensor(label)


def imagefolder(
    root: str,
    image_size: int = 32,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
) -> tuple[Dataset, Dataset]:
    """Images in ``root/train/<class>/*`` and ``root/val/<class>/*`` (torchvision's ImageFolder),
    resized to ``image_size`` squares; training images are cropped and flipped at random."""
    base = Path(root).expanduser()
    for split in ("train", "val"):
        if not (base / split).is_dir():
            raise FileNotFoundError(
                f"no {split} folder in {base}: imagefolder needs {base}/train/<class>/<image> "
                f"and {base}/val/<class>/<image>"
            )
    train = _ImageFolderSplit(base / "train", image_size, mean, std, augment=True)
    val = _ImageFolderSplit(base / "val", image_size, mean, std, augment=False)
    if train.classes != val.classes:
        raise FileNotFoundError(
            f"{base}: train and val have different class folders ({len(train.classes)} and "
            f"{len(val.classes)})"
        )
    return train, val


SHAPES = (
    "disk", "square", "ring", "plus", "diamond", "hbar", "vbar", "triangle", "cross", "frame",
)  # fmt: skip


def _draw_shapes(
    labels: torch.Tensor, difficulty: float, generator: torch.Generator
) -> torch.Tensor:
    """uint8 images (N, 3, 32, 32): one shape per image, of the class its label says."""
    count = labels.shape[0]
    side = 32

    def uniform(low: float, high: float, *shape: int) -> torch.Tensor:
        return low + (high - low) * torch.rand(count, *shape, generator=generator)

    jitter = 3 + 6 * difficulty
    center = uniform(16 - jitter, 16 + jitter, 2)[:, :, None, None]
    radius = uniform(6 - 2 * difficulty, 9, 1)[:, :, None, None]
    grid = torch.arange(side, dtype=torch.float32)
    dy = (grid[None, :, None] - center[:, 0]).abs()
    dx = (grid[None, None, :] - center[:, 1]).abs()
    r = radius[:, 0]
    distance = (dx**2 + dy**2).sqrt()
    box = torch.maximum(dx, dy)
    rising = grid[None, :, None] - center[:, 0]  # signed rows, for the triangle
    masks = torch.stack(
        [
            distance < r,
            box < r,
            (distance < r) & (distance > r / 2),
            ((dx < r / 3) & (dy < r)) | ((dy < r / 3) & (dx < r)),
            dx + dy < r,
            (dy < r / 3) & (dx < r),
            (dx < r / 3) & (dy < r),
            (rising.abs() < r) & (dx < (rising + r) / 2),
            ((dx - dy).abs() < r / 3) & (box < r),
            (box < r) & (box > r / 2),
        ]
    )  # (classes, N, H, W)
    shape = masks[labels, torch.arange(count)]
    contrast = 1.0 - 0.6 * difficulty
    foreground = uniform(0.4, 1.0, 3) * 255
    background = foreground * (1 - contrast) + uniform(0.0, 0.3, 3) * 255 * contrast
    images = torch.where(
        shape[:, None], foreground[:, :, None, None], background[:, :, None, None]
    )
    noise = torch.randn(count, 3, side, side, generator=generator) * (8 + 40 * difficulty)
    return (images + noise).clamp(0, 255).to(torch.uint8)


def shapes(
    n_train: int = 50_000, n_val: int = 10_000, difficulty: float = 0.3, seed: int = 0
) -> tuple[ImageTensorDataset, ImageTensorDataset]:
    """A generated, learnable, CIFAR-sized data set: 3x32x32 images of 10 shapes.

    Each image holds one shape (disk, square, ring, ...) at a random place, size and colour on
    a noisy background; ``difficulty`` in [0, 1] widens the placement, lowers the contrast and
    raises the noise. Deterministic from ``seed``; 60,000 images take a few seconds.
    """
    if not 0 <= difficulty <= 1:
        raise ValueError(f"difficulty must be between 0 and 1, got {difficulty}")
    generator = torch.Generator().manual_seed(seed)
    labels = [torch.arange(n) % len(SHAPES) for n in (n_train, n_val)]
    labels = [split[torch.randperm(len(split), generator=generator)] for split in labels]
    images = []
    for split in labels:  # in chunks: the masks of all classes for 50,000 images are large
        chunks = [_draw_shapes(part, difficulty, generator) for part in split.split(4096)]
        images.append(
            torch.cat(chunks) if chunks else torch.zeros(0, 3, 32, 32, dtype=torch.uint8)
        )
    pixels = images[0].float() / 255
    mean = tuple(pixels.mean(dim=(0, 2, 3)).tolist())
    std = tuple(pixels.std(dim=(0, 2, 3)).tolist())
    return (
        ImageTensorDataset(images[0], labels[0], mean, std, True, SHAPES),
        ImageTensorDataset(images[1], labels[1], mean, std, False, SHAPES),
    )
