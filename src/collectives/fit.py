"""Deprecated: moved to :mod:`collectives.tuning.fit` (the cost model and tuner live in
:mod:`collectives.tuning`). This module re-exports its names and warns on import."""

import warnings

from .tuning.fit import *  # noqa: F401,F403
from .tuning.fit import __all__  # noqa: F401

warnings.warn("collectives.fit is deprecated; import collectives.tuning.fit instead",
              DeprecationWarning, stacklevel=2)
