"""POISE: an online probe as the baseline, built across rollouts (arXiv 2605.07579 [paper]; docs/methods.md).

The baseline b̂ of a rollout is a small MLP probe on pooled hidden states and entropy statistics,
trained online (MSE to the reward) on current and recent rollouts with no gradient into the policy;
A = r − b̂. Cross-rollout: rollout i's baseline is computed from *other* rollouts' states of the same
prompt, never its own, so b̂_i does not depend on o_i and the estimator stays unbiased. It needs no
group statistics, so G = 2 works (each rollout's baseline comes from the other one).

Features per rollout (``poise_features``): [mean prompt state ‖ mean response state ‖ mean, std, max of
the response's token entropies], the states being the final-norm hidden states (the LM-head input).

Ours [ours], where the summary does not decide: the probe is Linear(D, 64) → GELU → Linear(64, 1) on
standardised features (running mean/std of the buffer), trained with Adam (lr 1e-3) for ``train_iters``
(20) full-batch steps per training step on a buffer of the last ``buffer_steps`` (4) steps' rollouts;
with G > 2, b̂_i = mean over j ≠ i of the probe's prediction for rollout j; a prompt with a single
rollout has no independent rollout and gets b̂ = 0 (counted as ``poise/lone_rows``); the baselines of a step are computed *before* the
probe sees that step's rewards (then its MSE and AUC on the step are held-out figures, logged as
``poise/probe_mse`` and ``poise/probe_auc``: the AUC of the probe's own prediction for "reward above the
step's mean reward", which is "correct" for 0/1 rewards and stays meaningful for shaped ones); no normalisation of A (r − b̂ as the summary states).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from mmrlvr.metric import Metric

POISE_HIDDEN = 64


def entropy_stats(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, 3]: mean, std (population) and max of the token entropies over each row's tokens with mask > 0."""
    valid = (mask > 0).to(entropy.dtype)
    n = valid.sum(-1).clamp_min(1.0)
    mean = (entropy * valid).sum(-1) / n
    var = (((entropy - mean[:, None]) ** 2) * valid).sum(-1) / n
    mx = torch.where(valid > 0, entropy, torch.full_like(entropy, -torch.inf)).amax(-1)
    mx = torch.where(valid.sum(-1) > 0, mx, torch.zeros_like(mx))
    return torch.stack([mean, var.sqrt(), mx], dim=-1)


def poise_features(prompt_pooled: torch.Tensor, response_pooled: torch.Tensor, entropy: torch.Tensor,
                   mask: torch.Tensor) -> torch.Tensor:
    """[N, 2H + 3] float32 probe inputs from pooled prompt/response states [N, H] and entropies [N, L]."""
    return torch.cat([prompt_pooled.float(), response_pooled.float(), entropy_stats(entropy.float(), mask)], -1)


def cross_rollout_baseline(pred: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(b [N], rows without another rollout): b_i = mean_{j ≠ i, same group} pred_j; 0 for a lone row."""
    b = torch.zeros_like(pred)
    lonely = 0
    for g in torch.unique(group_index).tolist():
        rows = (group_index == g).nonzero().flatten()
        n = rows.numel()
        if n < 2:
            lonely += n
            continue
        s = pred[rows].sum()
        b[rows] = (s - pred[rows]) / (n - 1)
    return b, lonely


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """ROC AUC of ``scores`` for boolean ``labels`` (Mann-Whitney, ties count 1/2); None if one class."""
    pos, neg = scores[labels], scores[~labels]
    if pos.numel() == 0 or neg.numel() == 0:
        return None
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean())


class PoiseProbe:
    """The online value probe: predicts a rollout's reward from its features; never touches the policy."""

    def __init__(self, in_dim: int, *, hidden: int = POISE_HIDDEN, lr: float = 1e-3, buffer_steps: int = 4,
                 train_iters: int = 20, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(in_dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 1))
        with torch.no_grad():  # seeded, independent of the global RNG (the policy's sampling stays reproducible)
            for p in self.net.parameters():
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) / max(p.shape[-1], 1) ** 0.5)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.buffer: deque[tuple[torch.Tensor, torch.Tensor]] = deque(maxlen=buffer_steps)
        self.train_iters = train_iters
        self.mu: torch.Tensor | None = None
        self.sd: torch.Tensor | None = None

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """[N] predicted rewards (0 before the first training step)."""
        if self.mu is None:
            return torch.zeros(x.shape[0])
        return self.net((x.float().cpu() - self.mu) / self.sd).squeeze(-1)

    def train(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Add (x [N, D], y [N]) to the buffer and fit on the buffer; returns the final training MSE."""
        self.buffer.append((x.detach().float().cpu(), y.detach().float().cpu()))
        xs = torch.cat([b[0] for b in self.buffer])
        ys = torch.cat([b[1] for b in self.buffer])
        self.mu, self.sd = xs.mean(0), xs.std(0, unbiased=False).clamp_min(1e-6)
        xn = (xs - self.mu) / self.sd
        loss = torch.zeros(())
        with torch.enable_grad():
            for _ in range(self.train_iters):
                self.opt.zero_grad(set_to_none=True)
                loss = ((self.net(xn).squeeze(-1) - ys) ** 2).mean()
                loss.backward()
                self.opt.step()
        return float(loss.detach())

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "mu": self.mu, "sd": self.sd,
                "buffer": list(self.buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.mu, self.sd = state["mu"], state["sd"]
        self.buffer.clear()
        self.buffer.extend(state["buffer"])


def poise_advantages(rewards: torch.Tensor, group_index: torch.Tensor, features: torch.Tensor, probe: PoiseProbe,
                     *, auc_threshold: float | None = None, train: bool = True) -> tuple[torch.Tensor, dict[str, Metric]]:
    """A = r − b̂ with the cross-rollout baseline, then one online training step of the probe.

    rewards: [N]; group_index: [N]; features: [N, D] (``poise_features``). Returns (A [N], stats): the
    probe's held-out MSE and AUC on this step (before it trains on it), its training MSE, lone rows."""
    pred = probe.predict(features)
    baseline, lonely = cross_rollout_baseline(pred, group_index)
    adv = rewards.float() - baseline.to(rewards.device)
    rows = len(rewards)
    stats: dict[str, Metric] = {"poise/probe_mse": Metric.mean(float(((pred - rewards.float().cpu()) ** 2).mean()), n=rows),
                                "poise/baseline_mean": Metric.mean(float(baseline.mean()), n=rows),
                                "poise/lone_rows": Metric.sum(float(lonely))}
    r = rewards.float().cpu()
    a = auc(pred, r > (r.mean() if auc_threshold is None else auc_threshold))
    if a is not None:  # an AUC does not combine exactly over processes: weighted by the rows it ranks
        stats["poise/probe_auc"] = Metric.mean(a, n=rows)
    if train:
        stats["poise/train_mse"] = Metric.mean(probe.train(features, rewards), n=rows)
    return adv, stats


@torch.no_grad()
def poise_features_from_model(model: torch.nn.Module, inputs: dict[str, Any], prompt_length: int,
                              response_mask: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Probe features from one no-grad forward of ``model`` on the rollout's inputs (RolloutBatch layout:
    P prompt positions, left-padded, then L response positions): [N, 2H + 3].

    The response states are those that predict each response token (positions P−1 .. P+L−2), the same
    the LM head reads; entropies come from the head on those states at ``temperature``."""
    from mmrlvr.credit.signals import final_hidden_states

    states, head = final_hidden_states(model, inputs)  # [N, P+L, H]
    P, L = prompt_length, response_mask.shape[1]
    attn = inputs.get("attention_mask")
    pmask = attn[:, :P] if attn is not None else torch.ones(states.shape[0], P, device=states.device)
    pm = pmask.to(states.dtype)[..., None]
    prompt_pooled = (states[:, :P] * pm).sum(1) / pm.sum(1).clamp_min(1.0)
    resp = states[:, P - 1:P - 1 + L]
    rm = (response_mask > 0).to(resp.dtype)[..., None].to(resp.device)
    response_pooled = (resp * rm).sum(1) / rm.sum(1).clamp_min(1.0)
    logits = head(resp.to(head.weight.dtype)).float() / temperature
    logp = torch.log_softmax(logits, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return poise_features(prompt_pooled, response_pooled, entropy, response_mask.to(entropy.device))
