"""Workloads: the model and data a study trains, by built-in name or ``package.module:function``.

Built-in models: ``digits_cnn``, ``mlp``. Built-in data sets: ``digits``.

A user's data function is called with ``data_args`` and returns ``(train_dataset, val_dataset)``
or a ``DataSplits``; a user's model function is called with ``model_args`` (plus ``num_classes``
and ``input_shape`` when it declares those parameters) and returns an ``nn.Module``.
"""

from autotune.workloads import digits as _digits  # noqa: F401  (registers built-ins)
from autotune.workloads import models as _models  # noqa: F401  (registers built-ins)
from autotune.workloads._registry import (
    DATASETS,
    MODELS,
    DataSplits,
    Workload,
    WorkloadError,
    load,
    register_dataset,
    register_model,
)

__all__ = [
    "DATASETS",
    "MODELS",
    "DataSplits",
    "Workload",
    "WorkloadError",
    "load",
    "register_dataset",
    "register_model",
]
