"""Deprecated: moved to :mod:`collectives.tuning.projection` (the cost model and tuner live in
:mod:`collectives.tuning`). This module re-exports its names and warns on import."""

import warnings

from .tuning.projection import *  # noqa: F401,F403
from .tuning.projection import __all__  # noqa: F401

warnings.warn("collectives.project is deprecated; import collectives.tuning.projection instead",
              DeprecationWarning, stacklevel=2)

if __name__ == "__main__":  # python -m collectives.project, as before
    main()  # noqa: F405
