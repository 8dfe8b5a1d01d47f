"""Deprecated: moved to :mod:`collectives.tuning.tune` (the cost model and tuner live in
:mod:`collectives.tuning`). This module re-exports its names and warns on import."""

import warnings

from .tuning.tune import *  # noqa: F401,F403
from .tuning.tune import __all__  # noqa: F401

warnings.warn("collectives.tune is deprecated; import collectives.tuning.tune instead",
              DeprecationWarning, stacklevel=2)

if __name__ == "__main__":  # python -m collectives.tune, as before
    main()  # noqa: F405
