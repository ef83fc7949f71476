"""The one place the version is written: ``pyproject.toml`` reads it at build time
(``[tool.setuptools.dynamic]``) and :mod:`mmfront` re-exports it, so they cannot disagree.
A module of its own so that reading it imports nothing else."""

__version__ = "0.1.0"
