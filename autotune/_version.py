"""autotune's version: the installed distribution's, or a source-tree marker.

A module of its own, at the bottom of the package, so that modules that stamp what they write
(study attributes, exported scripts, reports) need not import the package's ``__init__``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autotune")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0+source"
