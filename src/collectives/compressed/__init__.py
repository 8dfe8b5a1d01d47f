"""Compressed allreduce: only compressed data travels (see ``strategies.py`` for the catalogue)."""

from .api import compressed_allreduce
from .strategies import STRATEGIES
from .two_phase import server_residuals

__all__ = ["compressed_allreduce", "STRATEGIES", "server_residuals"]
