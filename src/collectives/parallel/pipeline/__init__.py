"""Pipeline parallelism: a model's layers cut into consecutive stages, one per rank of the
pipeline axis, each micro-batch's activations passed forward and their gradients back.

- :mod:`.actions`: the actions a schedule is made of, and checks of its properties (forward
  before backward, sends matched by receives, no deadlock, micro-batches held, the bubble on
  paper);
- :mod:`.gpipe`, :mod:`.one_f_one_b`: the two schedules, :data:`SCHEDULES` names them;
- :mod:`.executor`: :class:`Pipeline` runs one stage's actions with non-blocking
  point-to-point, and measures its bubble;
- :mod:`.failures`: a stage that raises makes every rank raise;
- :mod:`.partition`: the layers cut into stages, balanced by cost or as given.

docs/pipeline.md is the guide.
"""

from .actions import (BACKWARD, FORWARD, KINDS, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, Action,
                      check, ideal_bubble, peak_held, simulate)
from .executor import Pipeline, Stage, StepStats
from .failures import PipelineError
from .partition import balanced, given
from .schedules import SCHEDULES, build, check_sizes

__all__ = ["Action", "FORWARD", "BACKWARD", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD",
           "KINDS", "check", "ideal_bubble", "peak_held", "simulate", "Pipeline", "Stage",
           "StepStats", "PipelineError", "balanced", "given", "SCHEDULES", "build",
           "check_sizes"]
