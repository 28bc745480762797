"""mmrlvr.rewards: reward functions ``(completion, sample) -> RewardResult``, registered by name.

Importing this package registers the built-in rewards in ``REWARDS``:
``format``, ``accuracy`` (math-verify), ``choice``, ``numeric``, ``grounding`` (IoU), ``text`` and
``auto_accuracy`` (dispatch on ``sample.answer_type``). ``CombinedReward`` sums weighted rewards as the
config's ``rewards:`` list asks; ``answer_judge`` is the pass/fail judge for evaluation. The text helpers
in ``mmrlvr.rewards.parsing`` (think/answer split, ``\\boxed{}`` extraction) are shared with the
consistency judges and rubric extractors. Nothing here imports torch.
"""

from mmrlvr.rewards.base import REWARDS, RewardFn, build_reward, score_batch
from mmrlvr.rewards.parsing import (
    ParsedResponse,
    extract_boxed,
    extract_final_answer,
    locate_answer,
    normalize_answer,
    parse_number,
    parse_number_words,
    read_bare_number,
    split_number_unit,
    split_think_answer,
    strip_lead_in,
)
from mmrlvr.rewards.mathverify import MathVerdict, math_equal
from mmrlvr.rewards.format import FormatReward
from mmrlvr.rewards.accuracy import AccuracyReward
from mmrlvr.rewards.choice import ChoiceReward, extract_choice, options_from_meta
from mmrlvr.rewards.numeric import NumericReward, read_number, within_tolerance
from mmrlvr.boxes import iou
from mmrlvr.rewards.grounding import GroundingReward, match_boxes, parse_boxes
from mmrlvr.rewards.text import TextReward
from mmrlvr.rewards.auto import ANSWER_TYPES, AutoAccuracyReward, same_answer
from mmrlvr.rewards.combine import CombinedReward, RewardSpec, answer_judge, make_answer_judge
from mmrlvr.rewards.majority import MajorityVote
from mmrlvr.rewards.process import GatedProcess, NamedObjects
from mmrlvr.rewards.tool_use import ToolCallReward, ZoomIoUReward

__all__ = [
    "REWARDS", "RewardFn", "build_reward", "score_batch",
    "ParsedResponse", "split_think_answer", "extract_boxed", "extract_final_answer", "locate_answer",
    "normalize_answer", "parse_number", "parse_number_words", "read_bare_number", "split_number_unit",
    "strip_lead_in",
    "MathVerdict", "math_equal",
    "FormatReward", "AccuracyReward", "ChoiceReward", "NumericReward", "GroundingReward", "TextReward",
    "AutoAccuracyReward", "ANSWER_TYPES", "same_answer",
    "extract_choice", "options_from_meta", "read_number", "within_tolerance", "iou", "match_boxes", "parse_boxes",
    "CombinedReward", "RewardSpec", "answer_judge", "make_answer_judge", "MajorityVote",
    "GatedProcess", "NamedObjects", "ToolCallReward", "ZoomIoUReward",
]

# Rewards that live in their own packages register themselves on import; importing them here makes
# every reward name usable from a config after `import mmrlvr.rewards` (their heavy parts load lazily).
from mmrlvr.consistency import reward as _consistency_reward  # noqa: E402,F401  registers "consistency"
from mmrlvr.rubric import reward as _rubric_reward  # noqa: E402,F401  registers "rubric"
