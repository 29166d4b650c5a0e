"""autotune: find the PyTorch training configuration with the most accuracy per second.

The Python API: run a study from a notebook or a scheduler, as ``autotune run`` does::

    import autotune
    report = autotune.run("space.yaml")                   # RunReport; prints nothing
    print(report)                                          # its study, ending and answer
    best = report.best()                                   # the study's answer, a BestConfig

and use a study's answer in your own training code::

    import autotune
    best = autotune.load_best("quickstart")               # the best feasible configuration
    loader = best.make_loader(train_set)                   # DataLoader with the tuned knobs
    steps_per_epoch = len(loader) // best.config.accumulation_steps  # optimizer steps
    trainer = best.make_trainer(model, total_steps=epochs * steps_per_epoch)
    for inputs, targets in loader:
        trainer.train_step(*trainer.to_device(inputs, targets))
"""

from typing import TYPE_CHECKING, Any

from autotune._version import __version__

if TYPE_CHECKING:
    from autotune.export import BestConfig, ExportError, load_best, load_config
    from autotune.session import RunReport, run

__all__ = [
    "BestConfig",
    "ExportError",
    "RunReport",
    "__version__",
    "load_best",
    "load_config",
    "run",
]

_API = {"BestConfig": "export", "ExportError": "export", "load_best": "export"}
_API |= {"load_config": "export", "RunReport": "session", "run": "session"}


def __getattr__(name: str) -> Any:
    # The API pulls in torch and Optuna; importing it lazily keeps `import autotune` light.
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f"autotune.{_API[name]}"), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
