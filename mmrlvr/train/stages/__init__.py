"""The stages of a training step (docs/architecture.md). Importing this package registers the built-in ones.

    generate -> score -> shape -> advantages -> reference -> credit -> update -> record

One module per kind; a method's stages live with their kind (POISE's and POPO's advantages in ``advantages``,
POPO's update in ``update``, DelTA's hidden-state credit in ``credit``).
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

__all__ = ["MULTI_KINDS", "STAGE_KINDS", "STAGES", "Pipeline", "Stage", "register_stage", "select_stages",
           "validate_stages"]
