"""A plug-in shape stage that plants a fault on one rank (tests/test_distributed_faults.py).

``FAULT_RANK`` / ``FAULT_STEP`` (0-based) choose where; ``FAULT_KIND``: ``raise`` (an exception, after writing
the time of the raise to ``FAULT_STAMP``) or ``nan`` (one row's pi_old log-probs become NaN on that rank, so its loss is not finite).
"""

import os
import time

from mmrlvr.train.stages.base import Stage, register_stage


@register_stage("shape", "planted_fault", priority=-100)
class PlantedFault(Stage):
    def __call__(self, b) -> None:
        if os.environ.get("RANK") != os.environ.get("FAULT_RANK") or b.step != int(os.environ.get("FAULT_STEP", 0)):
            return
        if os.environ.get("FAULT_KIND") == "nan":  # pi_old of one row: that rank's ratio, hence its loss
            b.rollouts.old_logprobs[0] = float("nan")
            return
        with open(os.environ["FAULT_STAMP"], "w") as f:
            f.write(str(time.time()))
        raise RuntimeError(f"planted failure on rank {os.environ['RANK']} at step {b.step + 1}")
