"""The stages of a training step (docs/architecture.md). Importing this package registers the built-in ones.

    generate -> score -> shape -> advantages -> credit -> reference -> update -> record
"""

from mmrlvr.train.stages.base import (
    MULTI_KINDS,
    STAGE_KINDS,
    STAGES,
    Pipeline,
    Stage,
    register_stage,
    select_stages,
    validate_stages,
)
from mmrlvr.train.stages import advantages, credit, generate, record, reference, score, shape, update  # noqa: F401,E402
from mmrlvr.train.stages import seed  # noqa: F401,E402  (DelTA, POISE, POPO: docs/methods.md)

__all__ = ["MULTI_KINDS", "STAGE_KINDS", "STAGES", "Pipeline", "Stage", "register_stage", "select_stages",
           "validate_stages"]
