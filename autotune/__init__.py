"""autotune: find the PyTorch training configuration with the most accuracy per second."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autotune")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0+source"

__all__ = ["__version__"]
