"""Training/eval samples from the config, and a stateless data order.

``DataOrder`` derives the prompts of step k from (seed, k) alone: a fresh permutation per epoch seeded by
(seed, epoch). Resuming at step k therefore sees exactly the prompts an uninterrupted run would, with no
iterator state to checkpoint, and every process of a multi-process run agrees on the global batch.
"""

from __future__ import annotations

import numpy as np

from mmrlvr.config import DataConfig
from mmrlvr.errors import UserError
from mmrlvr.types import Sample

SYNTH_PREFIX = "synth:"
#: synthetic tasks whose rows carry an instance rubric (``mmrlvr.rubric.synth``), for the ``rubric`` reward
RUBRIC_SYNTH_TASKS: tuple[str, ...] = ("rubric_count",)
#: content seed of generated data; fixed so runs with different training seeds see the same data
SYNTH_DATA_SEED = 0


def load_split(spec: str, cfg: DataConfig, split: str, processor=None, reports: list | None = None) -> list[Sample]:
    """Samples for ``spec``: ``synth:TASK`` (generated in memory) or a dataset path.

    processor: when given, prompts longer than ``data.max_prompt_length`` are dropped and counted
    (``mmrlvr.data.length``); reports: a list that receives the load / length reports (their
    ``metrics()`` are what the trainer logs as ``data/dropped_too_long``).
    """
    if spec.startswith(SYNTH_PREFIX):
        from mmrlvr.data import rows_to_samples
        from mmrlvr.data.synth import TASKS, make_rows

        task = spec[len(SYNTH_PREFIX):]
        n = cfg.train_size if split == "train" else cfg.eval_size
        if task == "rubric_count":  # counting scenes with an all-programmatic instance rubric per row
            from mmrlvr.rubric.synth import rubric_samples

            return rubric_samples(n, split, seed=SYNTH_DATA_SEED, image_size=cfg.image_size, template=cfg.template)
        from mmrlvr.data.synth_video import VIDEO_TASKS, make_video_rows

        if task not in TASKS and task not in VIDEO_TASKS:
            raise UserError(f"data: unknown synthetic task {task!r}; known: "
                            f"{', '.join(TASKS + RUBRIC_SYNTH_TASKS + VIDEO_TASKS)}")
        rows = (make_video_rows(task, split, n, seed=SYNTH_DATA_SEED) if task in VIDEO_TASKS
                else make_rows(task, split, n, seed=SYNTH_DATA_SEED, image_size=cfg.image_size))
        samples = rows_to_samples(rows, template=cfg.template, system=getattr(cfg, "system_prompt", None),
                                  prompt_template=getattr(cfg, "prompt_template", None))
        if processor is not None and getattr(cfg, "max_prompt_length", 0):
            from mmrlvr.data.from_config import apply_length_limit, effective_options

            samples = apply_length_limit(samples, processor, effective_options(cfg, split), spec, reports)
        return samples
    from mmrlvr.data.from_config import load_configured

    return load_configured(spec, cfg, split, processor=processor, reports=reports)


class DataOrder:
    """Which samples make up step k's global batch: a pure function of (seed, step)."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        if n == 0:
            raise UserError("data: the training set is empty")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            rng = np.random.default_rng([self.seed, epoch, 0x5EED])
            self._perms = {epoch: rng.permutation(self.n)}  # keep one epoch cached
        return self._perms[epoch]

    def indices(self, step: int) -> list[int]:
        """Global sample indices of ``step`` (wraps across epochs)."""
        start = step * self.batch_size
        out = []
        for pos in range(start, start + self.batch_size):
            out.append(int(self._perm(pos // self.n)[pos % self.n]))
        return out


def shard(items: list, rank: int, world: int) -> list:
    """The contiguous slice of a global batch that process ``rank`` of ``world`` handles."""
    if len(items) % world:
        raise UserError(f"rollout.prompts_per_step ({len(items)}) must be divisible by the number of processes ({world})")
    per = len(items) // world
    return items[rank * per:(rank + 1) * per]
