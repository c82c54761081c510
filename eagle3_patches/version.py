"""This package's version: the one place it is written (``pyproject.toml`` reads it, the CLI and the patch-set
fingerprint that every rank compares print it)."""

__version__ = "0.1.0"
