"""Workloads: the model and data a study trains, by built-in name or ``package.module:function``.

Built-in models: ``digits_cnn``, ``mlp``. Built-in data sets: ``digits``.

A user's data function is called with ``data_args`` and returns ``(train_dataset, val_dataset)``
or a ``DataSplits``; a user's model function is called with ``model_args`` (plus ``num_classes``
and ``input_shape`` when it declares those parameters) and returns an ``nn.Module``.
"""

from autotune.workloads import digits, models
from autotune.workloads._registry import (
    DATASETS,
    MODELS,
    DataSplits,
    Workload,
    WorkloadError,
    load,
    model_kwargs,
    register_dataset,
    register_model,
    resolve_data,
    resolve_model,
)

register_dataset("digits")(digits.digits)
register_model("digits_cnn")(digits.digits_cnn)
register_model("mlp")(models.mlp)

__all__ = [
    "DATASETS",
    "MODELS",
    "DataSplits",
    "Workload",
    "WorkloadError",
    "load",
    "model_kwargs",
    "register_dataset",
    "register_model",
    "resolve_data",
    "resolve_model",
]
