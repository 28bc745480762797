"""Rollout/trainer agreement: how far the sampler's log-probs are from the trainer's pi_old on the same tokens.

The policy gradient's ratio is pi_theta / pi_old with pi_old the *trainer's* probability of each sampled token; the
tokens were drawn from the *sampler's*. When the two differ (another engine's kernels, bf16 against float32, a KV
cache, an image the engine preprocessed differently, weights that were not synced) the update is off-policy without
saying so — the mismatch verl, TRL and others report as the main source of instability in RL with vLLM rollouts
(Yao et al., "Your efficient RL framework secretly brings you off-policy RL training", 2025; the truncated
importance sampling fix is ``algo.rollout_correction``). These statistics make the gap visible every step.

Tokens right after an image are counted apart: a vision input the two stacks see differently shows there first.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from mmrlvr.metric import Metric

#: |log pi_trainer - log pi_sampler| above which a token counts as mismatched (``rollout/logprob_mismatch_share``):
#: a probability ratio outside [0.905, 1.105], about where TIS-style corrections start to matter
MISMATCH_THRESHOLD = 0.1
#: how many model tokens after an image count as "after the image"
AFTER_IMAGE_TOKENS = 8


def after_image_mask(response_mask: torch.Tensor, images_in_prompt: Sequence[int],
                     turns: Sequence[Sequence[dict[str, Any]] | None] | None = None,
                     first: int = AFTER_IMAGE_TOKENS) -> torch.Tensor:
    """[N, L] bool: the first ``first`` model tokens after an image in each row.

    A one-turn row whose prompt holds an image: its first ``first`` response tokens. A multi-turn row (``turns``,
    ``mmrlvr.rollout.multiturn``): also the first ``first`` tokens of every model turn that follows a tool turn which
    returned an image. Only tokens of ``response_mask`` count (tool turns carry none)."""
    n, length = response_mask.shape
    head = torch.zeros(n, length, dtype=torch.bool)
    for row in range(n):
        row_turns = turns[row] if turns is not None else None
        starts: list[int] = []
        if images_in_prompt[row] > 0:
            starts.append(0 if not row_turns else int(row_turns[0]["start"]))
        if row_turns:
            for prev, turn in zip(row_turns, row_turns[1:]):
                if turn["kind"] == "model" and prev["kind"] == "tool" and prev.get("images"):
                    starts.append(int(turn["start"]))
        for s in starts:
            head[row, s:min(length, s + first)] = True
    return head & (response_mask.cpu() > 0)


def agreement_metrics(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                      after_image: torch.Tensor | None = None,
                      threshold: float = MISMATCH_THRESHOLD) -> dict[str, Metric]:
    """The step's agreement statistics over the sampled tokens (``mask`` > 0); all tensors [N, L].

    ``rollout/logprob_abs_diff`` (mean |delta|), ``rollout/logprob_abs_diff_max``, ``rollout/logprob_mismatch_share``
    (share of tokens with |delta| > ``threshold``), and with ``after_image`` the mean and token count of the tokens
    after an image (``rollout/after_image/...``) and of the others (``rollout/rest/...``)."""
    valid = mask > 0
    diff = (trainer_logp.float() - sampler_logp.float()).abs()
    d = diff[valid]
    if d.numel() == 0:
        return {}
    n = d.numel()
    out = {"rollout/logprob_abs_diff": Metric.mean(float(d.mean()), n=n),
           "rollout/logprob_abs_diff_max": Metric.max(float(d.max())),
           "rollout/logprob_mismatch_share": Metric.mean(float((d > threshold).float().mean()), n=n)}
    if after_image is not None:
        for name, part in (("after_image", valid & after_image.to(valid.device)),
                           ("rest", valid & ~after_image.to(valid.device))):
            count = int(part.sum())
            out[f"rollout/{name}/tokens"] = Metric.sum(float(count))
            out[f"rollout/{name}/logprob_abs_diff"] = Metric.mean(float(diff[part].mean()) if count else 0.0, n=count)
    return out
