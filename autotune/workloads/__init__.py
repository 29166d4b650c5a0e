"""Workloads: the model and data a study trains, by built-in name (registered below) or
``package.module:function``.

A user's data function is called with ``data_args`` and returns ``(train_dataset, val_dataset)``
or a ``DataSplits``; a user's model function is called with ``model_args`` (plus ``num_classes``
and ``input_shape`` when it declares those parameters) and returns an ``nn.Module``.

``_reuse`` gives a study's workload back to the Python API: its loss, collate function and batch
layout.
"""

# re-exports: what other modules and the user import from autotune.workloads
from autotune.workloads._check import user_frame  # noqa: F401
from autotune.workloads._load import load, loss_function, model_kwargs  # noqa: F401
from autotune.workloads._registry import (  # noqa: F401
    DATASETS,
    MODEL_FAMILIES,
    MODELS,
    DataSplits,
    Workload,
    WorkloadError,
    register_dataset,
    register_model,
    resolve_data,
    resolve_model,
)
from autotune.workloads._reuse import (  # noqa: F401
    data_collate,
    recorded_layout,
    study_loss,
    study_workload,
)

# the built-ins, imported when a workload names one (digits needs scikit-learn, the image
# workloads torchvision: seconds of imports that a study of the user's own model never pays)
DATASETS["digits"] = "autotune.workloads.digits:digits"
DATASETS["shapes"] = "autotune.workloads.vision:shapes"
DATASETS["cifar10"] = "autotune.workloads.vision:cifar10"
DATASETS["imagefolder"] = "autotune.workloads.vision:imagefolder"
MODELS["digits_cnn"] = "autotune.workloads.digits:digits_cnn"
MODELS["mlp"] = "autotune.workloads.models:mlp"
MODEL_FAMILIES["torchvision"] = "autotune.workloads.vision:torchvision_model"
