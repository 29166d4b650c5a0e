"""An example of your own workload: any data set and model, plugged in as ``module:function``.

``custom_workload.yaml`` names these two functions. autotune imports this file from the space
file's folder (or the working directory), calls ``breast_cancer(**data_args)`` once per study and
``classifier(**model_args)`` once per trial (with ``num_classes`` and ``input_shape`` filled in
because the function declares them).
"""

import torch
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset


def breast_cancer(val_fraction: float = 0.25, seed: int = 0):
    """scikit-learn's bundled Wisconsin breast-cancer table: 569 rows, 30 features, 2 classes."""
    features, labels = load_breast_cancer(return_X_y=True)
    train_x, val_x, train_y, val_y = train_test_split(
        features, labels, test_size=val_fraction, stratify=labels, random_state=seed
    )
    mean, std = train_x.mean(axis=0), train_x.std(axis=0)

    def tensors(x, y):
        return TensorDataset(
            torch.tensor((x - mean) / std, dtype=torch.float32), torch.tensor(y, dtype=torch.long)
        )

    # Return (train, validation); the number of classes is read from the integer labels.
    return tensors(train_x, train_y), tensors(val_x, val_y)


def classifier(num_classes: int, input_shape: tuple[int, ...], hidden: int = 64) -> nn.Module:
    """A two-layer perceptron with dropout."""
    return nn.Sequential(
        nn.Linear(input_shape[0], hidden),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(hidden, num_classes),
    )
