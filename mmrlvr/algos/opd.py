"""On-policy distillation (OPD) with the per-token reverse KL to a teacher as the advantage.

The student samples its own responses; a frozen teacher scores the sampled tokens teacher-forced; each response
token's advantage is the negative per-token reverse KL (Qwen3 technical report, arXiv 2505.09388, on-policy
distillation; Thinking Machines, "On-Policy Distillation", Lu et al. 2025)::

    A_t = −(log π_student(y_t | s_t) − log π_teacher(y_t | s_t))          (discount 0, no group normalisation)
        + reward_weight · A_grpo                                         (optional: the task reward's group advantage)

log π_student is π_old, the policy that sampled (detached: the advantage is a constant of the policy-gradient
loss, whose gradient −A_t·∇log π_θ(y_t) makes the single-sample estimate of ∇ KL(π_θ ‖ π_teacher) at discount 0).
``reward_weight`` 0 (default) is pure distillation, as the Thinking Machines note runs it; the note's code adds the
term to the task advantages the same way (its ``kl_penalty_coef`` is a weight on the KL term, ours is 1 and the
weight sits on the reward term instead [ours]). The mixing term A_grpo is the GRPO group advantage of the task
reward (``mmrlvr.algos.advantages.grpo_advantages``), broadcast over the row's tokens.

Pure functions over tensors; the teacher pass and the stages are ``mmrlvr.train.stages.reference`` (``teacher``)
and ``mmrlvr.train.stages.advantages`` (``opd``).
"""

from __future__ import annotations

import torch


def reverse_kl_tokens(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """Per-token reverse-KL sample log π_student(y_t) − log π_teacher(y_t), 0 outside ``mask``.

    student_logprobs, teacher_logprobs, mask: [N, L] (mask > 0 marks the tokens that count). Returns [N, L] float32.
    """
    if student_logprobs.shape != teacher_logprobs.shape or student_logprobs.shape != mask.shape:
        raise ValueError(f"student {tuple(student_logprobs.shape)}, teacher {tuple(teacher_logprobs.shape)} and mask "
                         f"{tuple(mask.shape)} log-probs must have one shape [N, L]")
    diff = student_logprobs.detach().float() - teacher_logprobs.detach().float()
    return torch.where(mask > 0, diff, torch.zeros_like(diff))


def opd_advantages(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor,
                   reward_advantages: torch.Tensor | None = None, reward_weight: float = 0.0) -> torch.Tensor:
    """OPD's per-token advantages: A_t = −(lp_student − lp_teacher) + reward_weight · A_reward, 0 outside ``mask``.

    student_logprobs, teacher_logprobs, mask: [N, L]; reward_advantages: [N] (the group advantage of the task
    reward; None = 0). Returns [N, L] float32 (detached).
    """
    adv = -reverse_kl_tokens(student_logprobs, teacher_logprobs, mask)
    if reward_advantages is not None and reward_weight:
        if reward_advantages.shape != mask.shape[:1]:
            raise ValueError(f"reward_advantages {tuple(reward_advantages.shape)} must be [N] for mask "
                             f"{tuple(mask.shape)}")
        term = float(reward_weight) * reward_advantages.detach().float()[:, None].expand_as(adv)
        adv = adv + torch.where(mask > 0, term, torch.zeros_like(term))
    return adv
