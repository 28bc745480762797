"""Advantages: from [N] rewards and the group layout to [N] (or [N, L]) advantages.

- ``group`` (default): the estimator ``algo.advantage`` from ``mmrlvr.algos.ADVANTAGES`` (GRPO, Dr.GRPO, RLOO,
  REINFORCE++, plug-ins) with its parameters ``algo.advantage_params``. An estimator may return
  ``(advantages, diagnostics)``: the diagnostics are logged with the step's metrics.
- ``consistency_split`` (``consistency.split_advantage``): CORA-style split (arXiv:2507.11662; docs/consistency.md):
  A = alpha * A_task + beta(t) * A_cons, each normalised within its group; with
  ``consistency.scope: answer`` the consistency term reaches only the final answer's tokens ([N, L]).
- ``poise`` (``algo.advantage: poise``, arXiv 2605.07579): A = r − b̂, b̂ an online probe's prediction from the
  *other* rollouts of the prompt (pooled hidden states and entropies from one no-grad forward); the probe's
  held-out MSE/AUC go to ``batch.diagnostics`` (``poise/...``); the probe is in checkpoints.
- ``popo`` (``algo.loss: popo``, arXiv 2605.06650): POPO's group-softmax weights over positive rollouts become the
  advantages; non-positive rows leave the loss and its normaliser (``popo/...`` counts groups without one).
- ``opd`` (``algo.advantage: opd``, on-policy distillation, ``mmrlvr.algos.opd``): the task reward's GRPO group
  advantage [N] (zeros at the default ``reward_weight`` 0); the ``teacher`` reference stage completes it into the
  per-token −(log π_old − log π_teacher) + reward_weight · A_grpo [N, L] once π_old and the teacher's log-probs exist
  (docs/architecture.md).

Several processes: POISE and POPO are refused at validation (their probe / predictor learn from one process's
rollouts); the others compute the global batch's advantages on every rank (``global_rows``).
"""

from __future__ import annotations

from typing import Any

from mmrlvr.lazy_import import lazy_module
from mmrlvr.metric import Metric
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, all_rows, register_stage

torch = lazy_module("torch")  # selection (config checks) runs without torch; the stages' work imports it


def global_rows(rt, b: StepBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """(rewards, group index, response lengths, kept rows) of the step's *global* batch, and this process's rows.

    Several processes: an estimator with batch statistics (REINFORCE++ whitens over every row of the step)
    must not normalise over one rank's share, so every rank computes the advantages of the whole batch and
    keeps its rows. Group indices become global (each rank's offset by the groups of the ranks before it).
    One process: the batch's own tensors, unchanged."""
    gi = b.rollouts.group_index
    counts = (b.rollouts.response_mask > 0).sum(dim=-1)  # [N] response lengths
    keep = b.row_mask if b.row_mask is not None else torch.ones_like(b.rewards, dtype=torch.bool)
    if rt.accel.num_processes == 1:
        return b.rewards, gi, counts, keep, slice(0, len(b.rewards))
    rank = torch.full_like(gi, rt.accel.process_index)
    n_groups = torch.full_like(gi, int(gi.max()) + 1 if len(gi) else 0)
    (rewards, groups, counts, keep, ranks, ngs), rows = rt.gather_rows(b.rewards, gi, counts, keep, rank, n_groups)
    per_rank = dict(zip(ranks.tolist(), ngs.tolist()))
    offset, acc = {}, 0
    for r in sorted(per_rank):
        offset[r], acc = acc, acc + per_rank[r]
    groups = groups + torch.tensor([offset[r] for r in ranks.tolist()], dtype=groups.dtype)
    return rewards, groups, counts, keep, rows


@register_stage("advantages", "group")
class GroupAdvantage(Stage):
    """The registered estimator ``algo.advantage`` with ``algo.advantage_params``, over the global batch."""

    selected_by = ("algo.advantage",)
    fallback = True
    reads = ("algo.advantage", "algo.advantage_params.")

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.methods import configured

        name, params = configured(cfg, "advantage")
        return {"algo.advantage": name, **{f"algo.advantage_params.{k}": v for k, v in params.items()}}

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.algos.advantages import ADVANTAGES, call_advantage
        from mmrlvr.methods import configured

        name, params = configured(self.cfg, "advantage")
        ADVANTAGES.get(name)  # an unknown name fails here, listing the known ones
        # token_counts reach only the estimators that take them (REINFORCE++'s token-level whitening)
        self.estimator = lambda rewards, group_index, token_counts=None: call_advantage(
            name, rewards, group_index, token_counts=token_counts, **params)

    def estimate(self, b: StepBatch, *args) -> Any:
        """The estimator's advantages; diagnostics it returns (``(advantages, {name: value})``) go to the step's
        metrics. The estimator sees the whole global batch, so a plain value is the same on every process; a
        ``Metric`` keeps the reduction it declares."""
        out = self.estimator(*args)
        if isinstance(out, tuple):  # (advantages, diagnostics)
            out, diag = out
            b.diagnostics.update({k: v if isinstance(v, Metric) else Metric.same(float(v)) for k, v in diag.items()})
        return out

    def __call__(self, b: StepBatch) -> None:
        rewards, groups, counts, keep, rows = global_rows(self.rt, b)
        segments = getattr(b.rollouts, "trajectory_index", None)
        if segments is not None:  # ReSum (one process): one advantage per trajectory, from its final segment
            keep = keep & b.rollouts.final_segment
        if bool(keep.all()):
            b.advantages = self.estimate(b, rewards, groups, counts)[rows]
            return
        # rows outside the batch (unscored, dropped groups) take no part in their group's baseline
        adv = torch.zeros_like(rewards)
        if bool(keep.any()):
            adv[keep] = self.estimate(b, rewards[keep], groups[keep], counts[keep])
        if segments is not None:  # every segment trains with its trajectory's advantage
            final_row = {int(t): j for j, t in enumerate(segments.tolist()) if bool(b.rollouts.final_segment[j])}
            adv = adv[torch.tensor([final_row[int(t)] for t in segments.tolist()], dtype=torch.long)]
            if b.row_mask is not None:
                adv = torch.where(b.row_mask, adv, torch.zeros_like(adv))
        b.advantages = adv[rows]


@register_stage("advantages", "consistency_split", priority=10)
class ConsistencySplit(Stage):
    selected_by = ("consistency.split_advantage",)
    reads = ("consistency.",)
    when_text = "consistency.split_advantage: true"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.consistency.split_advantage

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.algos.advantages import split_advantages, token_split_advantages
        from mmrlvr.consistency.bonus import beta_schedule

        cfg, cc = self.cfg, self.cfg.consistency
        cons_w = next(s.weight for s in cfg.rewards if s.name == cc.component)
        cons = torch.tensor([r.components.get(cc.component, 0.0) for r in b.results], dtype=torch.float32)
        task = b.rewards - cons_w * cons
        beta = beta_schedule(b.step, cc.beta_warmup_steps, cc.beta_decay_steps, cc.beta, cc.beta_min)
        rollouts = b.rollouts
        if cc.scope == "answer":  # [N, L]: the consistency term reaches the answer's tokens only
            from mmrlvr.consistency.spans import answer_token_mask

            m = answer_token_mask([c.text for c in rollouts.completions], rollouts.response_ids,
                                  rollouts.response_mask, getattr(self.rt.processor, "tokenizer", self.rt.processor))
            b.advantages = token_split_advantages(task, cons, rollouts.group_index, m, cc.alpha, beta)
        else:
            b.advantages = split_advantages(task, cons, rollouts.group_index, cc.alpha, beta)


@register_stage("advantages", "poise", priority=20)
class PoiseAdvantage(Stage):
    """POISE (arXiv 2605.07579): r − b̂, b̂ an online probe on *other* rollouts' states of the same prompt."""

    selected_by = ("algo.advantage",)
    serves = ("advantage", "poise")
    reads = ("algo.advantage", "algo.advantage_params.")
    when_text = "algo.advantage: poise"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.advantage == "poise"

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from mmrlvr.train.distributed import one_process_only

        # each rank's probe would learn from its own shard only: the baselines would differ from one process's
        return one_process_only("algo.advantage: poise", "its online probe is trained on one process's rollouts")

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.methods import configured

        return {f"algo.advantage_params.{k}": v for k, v in configured(cfg, "advantage")[1].items()}

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.methods import configured

        self.params = configured(self.cfg, "advantage")[1]
        self.probe = None  # built on the first step, when the feature width is known
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"probe": self.probe.state_dict() if self.probe is not None else self._pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("probe") is None:
            return
        if self.probe is None:
            self._pending = state["probe"]
        else:
            self.probe.load_state_dict(state["probe"])

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.algos.poise import PoiseProbe, poise_advantages, poise_features_from_model

        rollouts = b.rollouts
        feats = poise_features_from_model(self.rt.policy, all_rows(self.rt, b), rollouts.prompt_length,
                                          rollouts.response_mask, temperature=self.cfg.rollout.temperature)
        if self.probe is None:
            self.probe = PoiseProbe(feats.shape[1], lr=self.params["lr"], buffer_steps=self.params["buffer_steps"],
                                    train_iters=self.params["train_iters"], seed=self.cfg.seed)
            if self._pending is not None:  # resumed: the probe's state from the checkpoint
                self.probe.load_state_dict(self._pending)
                self._pending = None
        adv, stats = poise_advantages(b.rewards, rollouts.group_index, feats.cpu(), self.probe)
        b.advantages = adv.to(b.rewards.device)
        b.diagnostics.update(stats)


@register_stage("advantages", "popo", priority=15)
class PopoAdvantage(Stage):
    """POPO's weights over positive rollouts as the advantages; other rows leave the loss (counted)."""

    selected_by = ("algo.loss",)
    reads = ("algo.loss_params.",)
    when_text = "algo.loss: popo"

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.methods import configured

        p = configured(cfg, "loss")[1]
        return {f"algo.loss_params.{k}": p[k] for k in ("temperature", "threshold")}

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.loss == "popo"

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from mmrlvr.train.distributed import one_process_only

        # the update's extra backward runs on the unwrapped model (DDP would not average its gradients), skips
        # micro-batches without positive rows (FSDP2 ranks would wait in each other's all-gathers), and its
        # predictor and EMA target live outside the wrapper
        return one_process_only("algo.loss: popo", "its similarity pass and predictor are not synchronised "
                                "across processes")

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.algos.masked import masked_mean
        from mmrlvr.algos.popo import popo_weights

        from mmrlvr.methods import configured

        p, rollouts = configured(self.cfg, "loss")[1], b.rollouts
        valid = (rollouts.response_mask > 0).to(torch.float32)
        ell = masked_mean(torch.where(valid > 0, rollouts.old_logprobs, 0.0), valid, dim=-1)
        adv, positive, stats = popo_weights(b.rewards, rollouts.group_index, ell, temperature=p["temperature"],
                                            threshold=p["threshold"])
        b.advantages = adv
        b.token_weights = b.token_weights * positive[:, None].to(b.token_weights.dtype)
        b.diagnostics.update(stats)


@register_stage("advantages", "tree", priority=5)
class TreeAdvantage(GroupAdvantage):
    """TreeRPO's per-token advantages (``mmrlvr.algos.tree``): each node's value, the mean reward of its leaves,
    normalised by ``algo.advantage`` among its siblings; a leaf's depth-d segment takes its depth-d node's
    advantage. Each tree lies whole on one process (its prompt's group), so no rank needs another's rows."""

    selected_by = ("rollout.strategy",)
    fallback = False
    absorbs = ("algo.advantage",)  # any registered estimator normalises the node values (pass_at_k, rloo, ...)
    reads = GroupAdvantage.reads + ("rollout.strategy",)
    when_text = "rollout.strategy: tree"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.rollout.strategy == "tree"

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.algos.tree import tree_advantages

        tree, rollouts = b.tree, b.rollouts
        if tree is None:
            raise RuntimeError("the tree advantages need the tree generate stage (rollout.strategy: tree)")
        keep = b.row_mask if b.row_mask is not None else torch.ones_like(b.rewards, dtype=torch.bool)
        parents = [tree.parents(d, rollouts.group_index) for d in range(tree.depth)]
        # dropped leaves (row_mask) count in no node's value and get 0, as flat groups leave them out of the baseline
        adv, per_depth = tree_advantages(b.rewards, tree.node, parents, tree.starts, tree.lengths,
                                         rollouts.response_ids.shape[1],
                                         lambda values, groups: self.estimate(b, values, groups), keep=keep)
        b.advantages = adv
        trees = len(rollouts.group_slices())  # each depth holds as many nodes in every tree
        b.diagnostics.update({f"tree/abs_advantage_depth{d + 1}": Metric.mean(v, n=trees)
                              for d, v in enumerate(per_depth)})


@register_stage("advantages", "opd", priority=20)
class OpdAdvantage(GroupAdvantage):
    """On-policy distillation's reward term (``algo.advantage: opd``): the GRPO group advantage of the task reward,
    [N], over the global batch as ``group`` computes it (zeros, nothing computed, at ``reward_weight`` 0). The
    distillation term needs π_old and the teacher's log-probs, which the reference kind computes after this one: the
    ``teacher`` reference stage (``mmrlvr.train.stages.reference``) turns this [N] into the per-token
    A_t = −(log π_old − log π_teacher) + reward_weight · A_grpo [N, L] (``mmrlvr.algos.opd``)."""

    selected_by = ("algo.advantage",)
    fallback = False
    serves = ("advantage", "opd")
    reads = ("algo.advantage", "algo.advantage_params.")
    when_text = "algo.advantage: opd"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.advantage == "opd"

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.methods import configured

        return {f"algo.advantage_params.{k}": v for k, v in configured(cfg, "advantage")[1].items()}

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from pathlib import Path

        src = cfg.algo.advantage_params.get("teacher") if isinstance(cfg.algo.advantage_params, dict) else None
        if not isinstance(src, str) or src.startswith("tiny:") or not src.strip():
            return []  # the parameter check names a missing teacher; the folder is checked on this machine
        own = (Path(cfg.output_dir) / "checkpoints").resolve()
        if Path(src).resolve().parent == own and cfg.keep_checkpoints > 0:
            return [f"algo.advantage_params.teacher: {src} is one of this run's own checkpoints and keep_checkpoints="
                    f"{cfg.keep_checkpoints} would prune it as the run saves newer ones (a resumed run loads it "
                    "again): set keep_checkpoints: 0 or copy the teacher elsewhere"]
        return []

    def __init__(self, rt) -> None:
        Stage.__init__(self, rt)
        from mmrlvr.algos.advantages import call_advantage
        from mmrlvr.methods import configured

        self.reward_weight = float(configured(self.cfg, "advantage")[1]["reward_weight"])
        self.estimator = lambda rewards, group_index, token_counts=None: call_advantage("grpo", rewards, group_index)

    def __call__(self, b: StepBatch) -> None:
        if self.reward_weight == 0.0:  # pure distillation: the reward term is 0 (the rewards are still logged)
            b.advantages = torch.zeros(len(b.rewards), dtype=torch.float32, device=b.rewards.device)
            return
        super().__call__(b)
