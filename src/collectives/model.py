"""Deprecated: moved to :mod:`collectives.tuning.cost_model` (the cost model and tuner live in
:mod:`collectives.tuning`). This module re-exports its names and warns on import."""

import warnings

from .tuning.cost_model import *  # noqa: F401,F403
from .tuning.cost_model import __all__  # noqa: F401

warnings.warn("collectives.model is deprecated; import collectives.tuning.cost_model instead",
              DeprecationWarning, stacklevel=2)
