"""Workloads: the model and data a study trains, by built-in name (``_registry``) or
``package.module:function``.

A user's data function is called with ``data_args`` and returns ``(train_dataset, val_dataset)``
or a ``DataSplits``; a user's model function is called with ``model_args`` (plus ``num_classes``
and ``input_shape`` when it declares those parameters) and returns an ``nn.Module``."""

# re-exports: what other modules and the user import from autotune.workloads
from autotune.workloads._check import user_frame  # noqa: F401
from autotune.workloads._load import load, loss_function, model_kwargs  # noqa: F401
from autotune.workloads._registry import (  # noqa: F401
    MODEL_FAMILIES,
    DataSplits,
    Workload,
    WorkloadError,
    resolve_data,
    resolve_model,
)
from autotune.workloads._reuse import data_collate, runnable_layout, study_loss, study_workload  # noqa: F401
