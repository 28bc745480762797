"""Generate: which prompts (the sampler), their G responses each (the rollout strategy), the vision cache.

``groups`` (the default) takes this process's contiguous share of the step's global prompt batch (a pure
function of seed and step, ``mmrlvr.train.data.DataOrder``), samples G responses per prompt with the rollout
engine (seeded per seed, step, prompt and sample), and starts the loss weights as the response mask.
With a frozen vision tower it also builds the step's ``VisionFeatureCache``: the tower runs once per distinct
prompt and every later pass (credit, reference, update) reuses its features (exact while the tower is frozen).
"""

from __future__ import annotations

import time

from mmrlvr.rollout.base import SamplingParams
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.data import DataOrder, shard
from mmrlvr.train.forward import VisionFeatureCache
from mmrlvr.train.stages.base import Stage, register_stage


@register_stage("generate", "groups")
class FlatGroups(Stage):
    """Flat groups: G independent samples per prompt."""

    @classmethod
    def validate(cls, cfg) -> list[str]:
        r = cfg.rollout
        out = []
        if r.group_size < 1:
            out.append(f"rollout.group_size: must be >= 1 (got {r.group_size})")
        if r.max_new_tokens < 1:
            out.append(f"rollout.max_new_tokens: must be >= 1 (got {r.max_new_tokens})")
        return out

    #: refill round r samples with the engine's seed key step + r * ROUND_KEY, so its responses never repeat
    #: round 0's (the engine seeds per seed, step, prompt and sample)
    ROUND_KEY = 10_000_000

    def __init__(self, rt) -> None:
        super().__init__(rt)
        self._refill_orders: dict[int, DataOrder] = {}

    def prompts(self, step: int, round: int = 0) -> list:
        """The sampler: this process's share of step ``step``'s prompts; refill round r > 0 draws from an order
        of its own (a pure function of seed, round and step, so every process and a resumed run agree)."""
        rt = self.rt
        order = rt.order
        if round > 0:
            if round not in self._refill_orders:
                self._refill_orders[round] = DataOrder(len(rt.train_samples), rt.order.batch_size,
                                                       self.cfg.seed * 1_000_003 + round)
            order = self._refill_orders[round]
        idx = shard(order.indices(step), rt.accel.process_index, rt.accel.num_processes)
        return [rt.train_samples[i] for i in idx]

    def __call__(self, b: StepBatch) -> None:
        cfg, rt = self.cfg, self.rt
        b.samples = self.prompts(b.step, b.round)
        params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)
        rt.model.eval()
        t0 = time.perf_counter()
        rollouts = rt.engine.generate(b.samples, cfg.rollout.group_size, params, seed=cfg.seed,
                                      step=b.step + b.round * self.ROUND_KEY)
        rollouts.timings.setdefault("generate_s", time.perf_counter() - t0)
        rollouts.timings["step"] = b.step
        b.rollouts = rollouts
        # count images in the prompt part only: a response may itself contain a <|vision_start|> token
        prompt_ids = rollouts.input_ids[:, :rollouts.prompt_length]
        b.images_per_row = (prompt_ids == rt.vision_start_id).sum(dim=1).tolist()
        if cfg.model.freeze_vision:
            vision = VisionFeatureCache(rt.policy, rollouts.vision, b.images_per_row, cfg.rollout.group_size,
                                        features=rollouts.image_features)
            b.vision = vision if vision.ok else None
        b.token_weights = rollouts.response_mask.clone()
