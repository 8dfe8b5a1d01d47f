"""Horovod's build questions (``hvd.mpi_built()`` ...), answered for collectives.

Horovod scripts and tests branch on how Horovod was compiled: which controllers (MPI, Gloo),
which GPU libraries (NCCL, oneCCL, DDL, CUDA, ROCm). collectives has one controller and one
transport, MPI through mpi4py, and its GPU path is CuPy's (docs/gpu.md), so the answers are:

=========================  ==============================================================
``mpi_built()``            True: every collective runs over an mpi4py communicator
``mpi_enabled()``          True
``mpi_threads_supported``  whether MPI was initialised with ``MPI_THREAD_MULTIPLE``
``gloo_built/enabled()``   False: no Gloo controller (``init_process_group`` sets up
                           torch.distributed's own gloo group, which is not Horovod's)
``nccl_built()``           0 (Horovod returns NCCL's version, 0 without it)
``ccl_built()``            False; ``ddl_built()`` False; ``rocm_built()`` False
``cuda_built()``           whether CuPy is installed: CUDA tensors travel through it
=========================  ==============================================================
"""

from __future__ import annotations

import importlib.util

from mpi4py import MPI

__all__ = ["mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
           "nccl_built", "ccl_built", "ddl_built", "cuda_built", "rocm_built"]


def mpi_built(verbose: bool = False) -> bool:
    """True: collectives runs over MPI (mpi4py)."""
    return True


def mpi_enabled() -> bool:
    """True: MPI is the controller of every job."""
    return True


def mpi_threads_supported() -> bool:
    """Whether MPI was initialised with ``MPI_THREAD_MULTIPLE`` (mpi4py's default asks for it)."""
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def gloo_built(verbose: bool = False) -> bool:
    """False: there is no Gloo controller."""
    return False


def gloo_enabled() -> bool:
    """False: there is no Gloo controller."""
    return False


def nccl_built(verbose: bool = False) -> int:
    """0: no NCCL (Horovod returns NCCL's version number when it has it)."""
    return 0


def ccl_built(verbose: bool = False) -> bool:
    """False: no oneCCL."""
    return False


def ddl_built(verbose: bool = False) -> bool:
    """False: no IBM DDL."""
    return False


def cuda_built(verbose: bool = False) -> bool:
    """Whether CUDA tensors can travel: they go through CuPy, so whether CuPy is installed."""
    return importlib.util.find_spec("cupy") is not None


def rocm_built(verbose: bool = False) -> bool:
    """False: no ROCm path."""
    return False
