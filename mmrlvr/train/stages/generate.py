"""Generate: which prompts (the sampler), their G responses each (the rollout strategy), the vision cache.

``groups`` (the default) takes this process's contiguous share of the step's global prompt batch (the sampler
``rollout.sampler``, ``mmrlvr.train.samplers``; the default ``shuffle`` is a pure function of seed and step),
samples G responses per prompt with the rollout engine (seeded per seed, step, prompt and sample), and starts the
loss weights as the response mask. After the step the sampler observes every prompt's rewards (gathered from
every process) and its state goes into checkpoints.
With a frozen vision tower it also builds the step's ``VisionFeatureCache``: the tower runs once per distinct
prompt and every later pass (credit, reference, update) reuses its features (exact while the tower is frozen).
"""

from __future__ import annotations

import time

from mmrlvr.train.batch import StepBatch
from mmrlvr.train.data import shard
from mmrlvr.train.stages.base import Stage, register_stage


@register_stage("generate", "groups")
class FlatGroups(Stage):
    """Flat groups: G independent samples per prompt."""

    fallback = True
    reads = ("rollout.",)

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.methods import configured

        r = cfg.rollout
        name, params = configured(cfg, "sampler")
        return {"rollout.sampler": name, **{f"rollout.sampler_params.{k}": v for k, v in params.items()},
                "rollout.prompts_per_step": r.prompts_per_step, "rollout.group_size": r.group_size,
                "rollout.engine": r.engine, "rollout.max_new_tokens": r.max_new_tokens,
                "rollout.temperature": r.temperature}

    #: refill round r samples with the engine's seed key step + r * ROUND_KEY, so its responses never repeat
    #: round 0's (the engine seeds per seed, step, prompt and sample)
    ROUND_KEY = 10_000_000

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.methods import configured
        from mmrlvr.train.samplers import build_sampler

        name, params = configured(self.cfg, "sampler")
        self.sampler = build_sampler(name, len(rt.train_samples), self.cfg.rollout.prompts_per_step, self.cfg.seed,
                                     params)
        self._index = {id(s): i for i, s in enumerate(rt.train_samples)}  # sample -> dataset index

    def prompts(self, step: int, round: int = 0) -> list:
        """This process's share of step ``step``'s prompts (round r > 0: a refill round's)."""
        rt = self.rt
        idx = shard(self.sampler.indices(step, round), rt.accel.process_index, rt.accel.num_processes)
        return [rt.train_samples[i] for i in idx]

    def after_step(self, b: StepBatch) -> None:
        """The sampler observes the step's prompts and rewards, gathered from every process (in rank order)."""
        from mmrlvr.train.distributed import _all_gather
        from mmrlvr.train.samplers import Sampler, StepOutcome

        if type(self.sampler).observe is Sampler.observe or b.rollouts is None or b.rewards is None:
            return  # a sampler that learns nothing needs no gather
        G, rows = self.cfg.rollout.group_size, b.rollouts.samples
        prompts = [self._index.get(id(rows[i]), -1) for i in range(0, len(rows), G)]
        rewards = b.rewards.reshape(-1, G).tolist()
        from mmrlvr.train.stages.shape import row_accuracy

        acc = row_accuracy(b)
        answers = [self.final_answer(c.text) for c in b.rollouts.completions]
        mine = (prompts, rewards, acc.reshape(-1, G).tolist() if acc is not None else None,
                [answers[i:i + G] for i in range(0, len(answers), G)])
        parts = _all_gather(mine, self.rt.accel.num_processes)
        accuracy = None if any(p[2] is None for p in parts) else [a for p in parts for a in p[2]]
        self.sampler.observe(StepOutcome(b.step, [i for p in parts for i in p[0]], [r for p in parts for r in p[1]],
                                         accuracy, [a for p in parts for a in p[3]]))

    def final_answer(self, text: str) -> str | None:
        """A response's final answer under the run's answer convention (R1 tags, ``\\boxed{}``, raw), or None."""
        from mmrlvr.data.prompts import answer_format
        from mmrlvr.rewards.parsing import locate_answer

        answer = locate_answer(text, answer_format(self.cfg.data))[0]
        return answer.strip() if answer and answer.strip() else None

    def state_dict(self):
        return self.sampler.state_dict()

    def load_state_dict(self, state) -> None:
        self.sampler.load_state_dict(state)

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.rollout.base import SamplingParams
        from mmrlvr.train.forward import VisionFeatureCache

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
