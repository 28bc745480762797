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
from mmrlvr.train.data import shard
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

    def prompts(self, step: int) -> list:
        """The sampler: this process's share of step ``step``'s prompts."""
        rt = self.rt
        idx = shard(rt.order.indices(step), rt.accel.process_index, rt.accel.num_processes)
        return [rt.train_samples[i] for i in idx]

    def __call__(self, b: StepBatch) -> None:
        cfg, rt = self.cfg, self.rt
        b.samples = self.prompts(b.step)
        params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)
        rt.model.eval()
        t0 = time.perf_counter()
        rollouts = rt.engine.generate(b.samples, cfg.rollout.group_size, params, seed=cfg.seed, step=b.step)
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
