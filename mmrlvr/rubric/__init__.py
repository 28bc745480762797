"""Robust rubric rewards (RLR³ / Rubrics-as-Rewards): schema, routing, judges, aggregation, reward, CLI.

Importing this package registers the ``rubric`` reward in ``mmrlvr.rewards.base.REWARDS`` and the
``openai`` / ``local`` judges in ``JUDGES``. Modules: ``schema`` (criteria and weights), ``loading``
(YAML files with line numbers, dataset columns), ``verifiers`` (extract from the response alone, then
verify), ``routing`` (program vs judge, minimal exposure), ``prompts`` (fenced judge prompts),
``verdicts`` (strict parsing, voting), ``judges`` + ``cache``, ``aggregate`` (rar, hierarchical,
saturation, POW3R), ``reward`` (``RubricReward``), ``agreement`` (kappa), ``cli``, ``synth``
(the local OpenAI-compatible test server lives in ``mmrlvr.testing.judge_server``).
"""

from mmrlvr.rubric.aggregate import (
    AGGREGATIONS,
    Pow3rConfig,
    hierarchical,
    pass_rates,
    pow3r_targets,
    pow3r_update,
    rar,
    saturated,
    score_group,
)
from mmrlvr.rubric.agreement import Agreement, agreement, cohen_kappa, vote_agreement
from mmrlvr.rubric.judges import (
    JUDGES,
    HFChatGenerator,
    Judge,
    JudgeStats,
    JudgeUnavailableError,
    LocalJudge,
    OpenAIJudge,
    build_judge,
    judge_endpoint_problem,
    judge_param_problems,
)
from mmrlvr.rubric.loading import RubricError, load_rubric_file, load_rubric_text, parse_instance_rubric
from mmrlvr.rubric.prompts import JudgeRequest, escape_fences, openai_messages, render_user_text
from mmrlvr.rubric.reward import RubricReward
from mmrlvr.rubric.routing import criterion_verdicts, judge_request, judge_twin, route, run_program
from mmrlvr.rubric.schema import CATEGORIES, DEFAULT_WEIGHTS, Check, Criterion, Rubric
from mmrlvr.rubric.verdicts import Verdict, majority, parse_verdict

__all__ = [
    "AGGREGATIONS", "Agreement", "CATEGORIES", "Check", "Criterion", "DEFAULT_WEIGHTS", "HFChatGenerator",
    "JUDGES", "Judge", "JudgeRequest", "JudgeStats", "JudgeUnavailableError", "LocalJudge", "OpenAIJudge", "Pow3rConfig", "Rubric",
    "RubricError", "RubricReward", "Verdict", "agreement", "build_judge", "cohen_kappa", "escape_fences",
    "criterion_verdicts", "hierarchical", "judge_endpoint_problem", "judge_param_problems", "judge_request", "judge_twin", "load_rubric_file", "load_rubric_text",
    "majority", "openai_messages", "parse_instance_rubric", "parse_verdict", "pass_rates", "pow3r_targets",
    "pow3r_update", "rar", "render_user_text", "route", "run_program", "saturated", "score_group",
    "vote_agreement",
]
