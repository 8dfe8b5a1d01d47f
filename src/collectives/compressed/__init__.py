"""Compressed allreduce: only compressed data travels (see ``strategies.py`` for the catalogue)."""

from .api import compressed_allreduce
from .strategies import STRATEGIES

__all__ = ["compressed_allreduce", "STRATEGIES"]
