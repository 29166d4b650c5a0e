"""An example of your own workload: any data set and model, plugged in as ``module:function``.

``custom_workload.yaml`` names these two functions. autotune imports this file from the space
file's folder (or the working directory), calls ``clusters(**data_args)`` once per study and
``classifier(**model_args)`` once per trial (with ``num_classes`` and ``input_shape`` filled in
because the function declares them).
"""

import torch
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset


def clusters(rows: int = 24_000, val_fraction: float = 0.2, seed: int = 0):
    """A generated table (scikit-learn's make_classification): ``rows`` rows of 20 features,
    4 classes of 4 clusters each. An MLP learns it over a few epochs."""
    features, labels = make_classification(
        n_samples=rows,
        n_features=20,
        n_informative=12,
        n_classes=4,
        n_clusters_per_class=4,
        class_sep=1.2,
        random_state=seed,
    )
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


def classifier(num_classes: int, input_shape: tuple[int, ...], hidden: int = 256) -> nn.Module:
    """A perceptron with two hidden layers."""
    return nn.Sequential(
        nn.Linear(input_shape[0], hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )
