"""Shape: reward transforms and row filters that see the whole batch, applied in priority order.

- ``overlong`` (DAPO soft overlong punishment, arXiv:2503.14476 §3.4): a linear penalty in the last
  ``algo.overlong_cache`` tokens before ``rollout.max_new_tokens``, added to the reward.
- ``mask_truncated`` (DAPO overlong filtering): responses that hit the length limit leave the loss.
- ``dynamic_sampling`` (DAPO §3.2): groups whose rewards are all equal carry no signal and leave the loss
  and its normaliser.

- ``vote_split`` (TTRL's vote/train split, a majority vote's ``votes``): of the V samples per prompt that voted,
  G train; the others leave the batch.

Group-aware reward transforms (majority-vote labels, gating, normalisation) register here too: they read
``batch.results`` / ``batch.rewards`` and ``batch.rollouts.group_index`` and write ``batch.rewards``.
"""

from __future__ import annotations

from typing import Any

from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import Method, Param
from mmrlvr.metric import Metric
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, register_stage

torch = lazy_module("torch")  # selection (config checks) runs without torch; the stages' work imports it


@register_stage("shape", "drop_unscored", priority=40)
class DropUnscored(Stage):
    """Rows a reward could not score (``RewardResult.dropped``: e.g. a gold answer that does not parse, with
    ``on_unparsed_gold: drop``) leave the batch: no loss, no normaliser, no part in their group's baseline — as TRL
    does with a reward of None. Counted in ``reward/dropped_rows``."""

    def __call__(self, b: StepBatch) -> None:
        dropped = torch.tensor([bool(getattr(r, "dropped", False)) for r in b.results])
        b.diagnostics["reward/dropped_rows"] = Metric.sum(float(dropped.sum()))
        if not bool(dropped.any()):
            return
        keep = ~dropped if b.row_mask is None else b.row_mask & ~dropped
        b.row_mask = keep
        b.token_weights[~keep] = 0.0


@register_stage("shape", "overlong", priority=30)
class Overlong(Stage):
    selected_by = ("algo.overlong_cache",)
    reads = ("algo.overlong_cache", "algo.overlong_penalty")
    when_text = "algo.overlong_cache > 0"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.overlong_cache > 0

    def __call__(self, b: StepBatch) -> None:
        lengths = b.rollouts.response_mask.sum(dim=1)
        a = self.cfg.algo
        from mmrlvr.algos.sampling import overlong_penalty

        b.rewards = b.rewards + overlong_penalty(lengths, self.cfg.rollout.max_new_tokens, a.overlong_cache,
                                                 a.overlong_penalty)


@register_stage("shape", "mask_truncated", priority=20)
class MaskTruncated(Stage):
    selected_by = ("algo.mask_truncated",)
    when_text = "algo.mask_truncated: true"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.mask_truncated

    def __call__(self, b: StepBatch) -> None:
        trunc = torch.tensor([c.finish_reason == "length" for c in b.rollouts.completions])
        b.token_weights[trunc] = 0.0


def row_accuracy(b: StepBatch) -> torch.Tensor | None:
    """[N] 1.0 where the verifier judged the answer right (the score stage's ``RewardResult.judged``, the
    ``accuracy`` metric's), or None when the rows have no gold answer to judge (e.g. grounding: boxes only) — then
    the filter reads the total reward."""
    rollouts = b.rollouts
    if all(getattr(s, "answer", None) in (None, "") for s in rollouts.samples):
        return None
    return torch.tensor([float(r.judged[0]) for r in b.results])


#: dynamic sampling's parameters (``algo.dynamic_sampling_params``), declared once: help, defaults, ranges
DYNAMIC_SAMPLING = Method("shape stage", "dynamic_sampling", "DAPO dynamic sampling", (
    Param("metric", "accuracy", "keep groups whose accuracy varies (DAPO) or whose total reward varies",
          choices=("accuracy", "reward")),
    Param("max_rounds", 3, "generation rounds per step to refill dropped groups (1 = no refill; DAPO: until full) "
          "[ours: 3]", ">= 1", lambda v: v >= 1)), source="arXiv:2503.14476")


def dynamic_sampling_params(cfg: Any) -> dict[str, Any]:
    """``algo.dynamic_sampling_params`` over their defaults (checked at load: a bad value raises here)."""
    values, problems = DYNAMIC_SAMPLING.resolve(cfg.algo.dynamic_sampling_params, "algo.dynamic_sampling_params")
    if problems:
        from mmrlvr.errors import ConfigErrors

        raise ConfigErrors(problems)
    return values


@register_stage("shape", "dynamic_sampling", priority=10)
class DynamicSampling(Stage):
    """DAPO dynamic sampling (arXiv:2503.14476 §3.2): drop the groups whose accuracy is all 0 or all 1 and draw
    more prompts until the step has as many groups with signal as it asked for.

    Parameters (``algo.dynamic_sampling_params``, ``DYNAMIC_SAMPLING``):

    - ``metric``: ``accuracy`` (DAPO, verl's ``filter_groups.metric: acc``) or ``reward``
      (the total reward: also keeps groups whose only spread is a shaping term). Rows without a gold answer
      (grounding) fall back to the reward.
    - ``max_rounds``: generation rounds per step, the first included (DAPO: "until the
      batch is full"; verl bounds it with ``max_num_gen_batches``). A refill round runs the earlier stages
      (generate, score, the shaping before this one) on fresh prompts and keeps their groups with signal; surplus
      groups are discarded (DAPO). If the rounds run out, dropped groups fill the batch to its size with zero
      weight and leave every normaliser, so shapes stay the same on every process. With several processes the
      rounds are decided together (another round while any rank's shard lacks groups with signal) and each
      rank fills its own shard from its own share of the refill prompts: with refill rounds the batch is the
      one-process batch's statistical twin, not its copy (the one-process run fills from the global batch).
    Every generated group, kept or dropped, stays in ``batch.generated`` (round order) for the step's end: a
    sampler learns from all of them (a curriculum must see the all-agree prompts it would otherwise draw again).
    Metrics: ``dynamic_sampling/rounds``, ``/kept_groups``, ``/fill_groups``.
    """

    selected_by = ("algo.dynamic_sampling",)
    reads = ("algo.dynamic_sampling_params.",)
    when_text = "algo.dynamic_sampling: true"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.dynamic_sampling

    @classmethod
    def validate(cls, cfg) -> list[str]:
        return DYNAMIC_SAMPLING.resolve(cfg.algo.dynamic_sampling_params, "algo.dynamic_sampling_params")[1]

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        return {f"algo.dynamic_sampling_params.{k}": v for k, v in dynamic_sampling_params(cfg).items()}

    def __init__(self, rt) -> None:
        super().__init__(rt)
        self.params = dynamic_sampling_params(self.cfg)  # metric, max_rounds (checked at load)

    def keep_groups(self, b: StepBatch) -> torch.Tensor:
        """[groups] bool: the groups whose metric varies."""
        metric = self.params["metric"]
        acc = row_accuracy(b) if metric == "accuracy" else None
        if acc is None:
            metric = "reward"
        from mmrlvr.algos.sampling import dynamic_sampling_filter

        return dynamic_sampling_filter(b.rewards, b.rollouts.group_index, accuracy=acc, metric=metric)

    def __call__(self, b: StepBatch) -> None:
        if b.round > 0:  # inside a refill round only the earlier stages run (Pipeline.run stops before us)
            return
        target = len(b.rollouts.group_slices())  # groups (their sizes may differ: a budget sampler)
        keep = self.keep_groups(b)
        parts = [(b, [g for g in range(target) if keep[g]])]
        dropped = [(b, [g for g in range(target) if not keep[g]])]
        kept, rounds = len(parts[0][1]), 1
        # another round is decided from the global count, so every rank runs the same rounds (a rank that
        # generated alone would leave the others in FSDP2's all-gathers); a rank whose shard is full takes nothing
        while self.rt.any_rank(kept < target) and rounds < self.params["max_rounds"]:
            extra = self.rt.pipeline.run(b.step, round=rounds, stop_before=self)
            rounds += 1
            k = self.keep_groups(extra)
            n_extra = len(extra.rollouts.group_slices())
            take = [g for g in range(n_extra) if k[g]][:max(target - kept, 0)]
            parts.append((extra, take))
            dropped.append((extra, [g for g in range(n_extra) if not k[g]]))
            kept += len(take)
            for key, v in extra.reward_metrics.items():  # counters of the latest round
                b.reward_metrics[key] = v
        fill = []
        for src, groups in dropped:
            for g in groups:
                if kept + len(fill) < target:
                    fill.append((src, g))
        b.diagnostics.update({"dynamic_sampling/rounds": Metric.max(float(rounds)),
                              "dynamic_sampling/kept_groups": Metric.sum(float(kept)),
                              "dynamic_sampling/fill_groups": Metric.sum(float(len(fill)))})
        if rounds == 1:
            b.row_mask = keep[b.rollouts.group_index]  # [N] bool
            b.token_weights[~b.row_mask] = 0.0
            return
        selected = [(src, g, True) for src, groups in parts for g in groups] + [(src, g, False) for src, g in fill]
        import copy

        # every round's groups, kept or dropped, as generated: what a sampler observes after the step (round 0 is
        # ``b`` as it stands now; _assemble rebinds b's fields, so the shallow copy keeps round 0's). A round an
        # earlier shaping stage already rebuilt (the vote/train split) brings what it generated instead
        b.generated = (list(b.generated) or [copy.copy(b)]) + [rb for src, _ in parts[1:]
                                                               for rb in src.generated_rounds()]
        self._assemble(b, selected)

    def _assemble(self, b: StepBatch, selected: list) -> None:
        """Rebuild ``b`` from whole groups of several rounds' batches (kept groups first, then fill)."""
        # consecutive groups from the same source batch are selected together
        by_src: list[tuple[StepBatch, list[int], list[bool]]] = []
        for src, g, kept in selected:
            if by_src and by_src[-1][0] is src:
                by_src[-1][1].append(g)
                by_src[-1][2].append(kept)
            else:
                by_src.append((src, [g], [kept]))
        parts, keep_rows = [], []
        for src, groups, kept in by_src:
            spans = src.rollouts.group_slices()
            parts.append((src, [r for g in groups for r in range(spans[g].start, spans[g].stop)]))
            keep_rows.extend(k for g, k in zip(groups, kept) for _ in range(spans[g].stop - spans[g].start))
        assemble_rows(self.rt, b, parts)
        b.row_mask = torch.tensor(keep_rows)
        b.token_weights[~b.row_mask] = 0.0


def assemble_rows(rt, b: StepBatch, parts: list[tuple[StepBatch, list[int]]], trim: bool = False) -> None:
    """Rebuild ``b`` from rows of scored batches, in order: ``parts`` = ``(source batch, its rows)``, each part's
    rows group-contiguous (whole groups — dynamic sampling's refill — or a subset of every group: the vote/train
    split). Sets the rollouts (groups renumbered in order), results, rewards, token weights (padded to the widest
    source), prompts, images per row and, when ``b`` has one, the vision cache (the engine's or the sources' cached
    features: no second vision-tower pass). ``row_mask`` is the caller's (it says which rows count). ``trim``: cut the
    response positions none of the chosen rows uses (``mmrlvr.rollout.merge.trim_responses``), so the passes after
    shaping cost what the chosen rows need."""
    from mmrlvr.rollout.merge import concat_rollouts, select_rows, trim_responses
    from mmrlvr.train.forward import VisionFeatureCache

    pieces, results, rewards, weights = [], [], [], []
    length = max(src.rollouts.response_ids.shape[1] for src, _ in parts)
    for src, rows in parts:
        pieces.append(select_rows(src.rollouts, rows, rt.vision_start_id))
        results.extend(src.results[r] for r in rows)
        rewards.append(src.rewards[rows])
        w = src.token_weights[rows]
        weights.append(torch.nn.functional.pad(w, (0, length - w.shape[1])))
    tok = getattr(rt.processor, "tokenizer", rt.processor)
    rollouts = concat_rollouts(pieces, pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
    rollouts.timings = dict(b.rollouts.timings)
    if trim:
        rollouts = trim_responses(rollouts)
        weights = [w[:, :rollouts.response_ids.shape[1]] for w in weights]
    features = rollouts.image_features
    if features is None and all(getattr(src.vision, "ok", False) for src, _ in parts):
        features = [f for src, rows in parts for r in rows
                    for f in src.vision.features[src.vision.first_image[r]:src.vision.first_image[r + 1]]]
    b.rollouts, b.results, b.rewards = rollouts, results, torch.cat(rewards)
    b.samples = [rollouts.samples[s.start] for s in rollouts.group_slices()]
    b.token_weights = torch.cat(weights)
    b.images_per_row = rollouts.images_per_row(rt.vision_start_id)
    if b.vision is not None:
        vision = VisionFeatureCache(rt.policy, rollouts.vision, b.images_per_row, rollouts.rows_sharing_images(),
                                    features=features)
        b.vision = vision if vision.ok else None


@register_stage("shape", "vote_split", priority=45)
class VoteSplit(Stage):
    """TTRL's vote/train split (Zuo et al. 2025, arXiv 2504.16084; official code github.com/PRIME-RL/TTRL, which
    votes over ``n_votes_per_prompt`` = 64 samples and trains on ``n_samples_per_prompt`` = 32): a majority-vote
    reward (``majority_vote``, ``cocov``) with ``votes: V`` > G made the generate stage sample V responses per
    prompt, and the score stage voted each prompt's pseudo-label over all V and scored every row against it. This
    stage keeps G = ``rollout.group_size`` rows of every group for training; the others leave the batch (rollouts,
    results, rewards, token weights, vision cache — ``assemble_rows``, as dynamic sampling rebuilds a batch — and
    the response positions only they used), so every later pass costs G rows per prompt.

    Which G: the first G of each group, as TTRL's code does (``_select_top_k_per_prompt`` in
    ``verl/verl/trainer/ppo/ray_trainer.py``: rows ``[0, n_samples)`` of every prompt's ``n_votes``). The V
    responses are independent draws, each seeded per (seed, step, prompt, sample index), so the first G are a
    uniformly random G of the V in distribution, and a run and its resume keep the same rows without a generator
    of their own; they are seeded as the G rows of a run without ``votes`` are. (No separate random draw seeded by
    (seed, step, prompt) is made: TTRL's first-G rule is one already, in distribution.)

    Runs first among the shaping stages (after ``guide``, which ``votes`` refuses): the later transforms and
    dynamic sampling see the trained batch, as without votes (a refill round runs this stage too). The sampler
    observes all V rows of every group, with the rewards they were scored (``StepBatch.generated``). Metrics: the
    reward's ``majority/*`` are over the V votes, ``majority/votes`` is V; ``rollout/samples`` and
    ``rollout/decoded_tokens`` count what was generated, ``group_size/*`` and the rollout records what trained.
    """

    reads = ("rewards",)
    when_text = "a majority_vote or cocov reward sets params.votes"

    @classmethod
    def when(cls, cfg) -> bool:
        from mmrlvr.train.reward_setup import vote_entries

        return any(v != 0 for _, _, v in vote_entries(cfg))

    @classmethod
    def reason(cls, cfg) -> str:
        from mmrlvr.train.reward_setup import vote_entries

        return ", ".join(f"rewards[{i}].params.votes: {v}" for i, _, v in vote_entries(cfg) if v != 0)

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.train.reward_setup import vote_entries

        out: dict[str, Any] = {f"rewards[{i}].params.votes": v for i, _, v in vote_entries(cfg) if v != 0}
        out["rollout.group_size"] = cfg.rollout.group_size
        out["kept per prompt"] = f"the first {cfg.rollout.group_size} (as TTRL's code)"
        return out

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from mmrlvr.train.reward_setup import vote_entries
        from mmrlvr.train.tool_setup import multi_turn

        g, out = cfg.rollout.group_size, []
        ints = [(i, v) for i, _, v in vote_entries(cfg) if isinstance(v, int) and not isinstance(v, bool)]
        for i, v in ints:  # other types: the reward's own check names them
            if 0 < v <= g:  # a negative one: the reward's own check
                out.append(f"rewards[{i}].params.votes: {v} must be 0 (vote over the rows that train) or more than "
                           f"rollout.group_size ({g}): the pseudo-label is voted over `votes` samples per prompt and "
                           f"rollout.group_size of them train")
        active = [(i, v) for i, v in ints if v > g]
        if len({v for _, v in active}) > 1:
            out.append(" and ".join(f"rewards[{i}].params.votes ({v})" for i, v in active) + " differ: the "
                       "generate stage draws one number of samples per prompt; give them the same votes")
        if not active:
            return out
        key = f"rewards[{active[0][0]}].params.votes: {active[0][1]}"
        r = cfg.rollout
        from mmrlvr.train.samplers import sampler_class

        if sampler_class(cfg).sizes_groups:
            out.append(f"{key} and rollout.sampler: {r.sampler} cannot be combined: that sampler sizes every group "
                       f"itself, the vote/train split samples `votes` per prompt and trains {g}; choose one")
        if r.strategy == "tree":
            out.append(f"{key} and rollout.strategy: tree cannot be combined: a tree's leaves are its group "
                       "(branching^depth of them, sharing segments); the vote/train split needs independent samples")
        if multi_turn(cfg):
            which = "rollout.tools" if r.tools else "rollout.summarize"
            out.append(f"{key} and {which} cannot be combined: multi-turn trajectories (and ReSum's segment rows) "
                       "are not split into votes and trained rows yet; use single-turn rollouts")
        if r.guide:
            out.append(f"{key} and rollout.guide cannot be combined: NPO's guide replaces a row of a group and "
                       "scores the group again, which would vote over the trained rows only")
        named = cfg.stages.generate if cfg.stages is not None else None
        if named and named != "groups":
            out.append(f"{key} and stages.generate: {named} cannot be combined: only the groups stage draws "
                       "`votes` samples per prompt")
        return out

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.train.reward_setup import samples_per_prompt

        self.votes = samples_per_prompt(self.cfg)

    def __call__(self, b: StepBatch) -> None:
        import copy

        g, v = self.cfg.rollout.group_size, self.votes
        spans = b.rollouts.group_slices()
        sizes = sorted({s.stop - s.start for s in spans} - {v})
        if sizes:
            raise RuntimeError(f"vote_split: every prompt should have votes={v} samples, got groups of {sizes} rows "
                               "(a generate stage that does not draw rewards[i].params.votes per prompt)")
        rows = [r for s in spans for r in range(s.start, s.start + g)]  # the first G of each group (TTRL's code)
        if not b.generated:  # what the step generated, every vote: the sampler observes it after the step
            b.generated = [copy.copy(b)]
        mask = b.row_mask
        assemble_rows(self.rt, b, [(b, rows)], trim=True)
        if mask is not None:
            b.row_mask = mask[rows]


#: the keys ``rollout.guide`` takes, with their defaults (``from`` has none: it names the guide)
GUIDE_DEFAULTS = {"gate": 0.6, "tries": 4, "delta": 10}


@register_stage("shape", "guide", priority=50)
class NearFutureGuide(Stage):
    """NPO, near-future guide trajectories (arXiv 2604.20733; no official code is public): for every group whose
    on-policy accuracy is below ``gate`` (0.6, the paper's), one slot becomes a verified-correct response of a
    *later* checkpoint of the same run (``rollout.guide.from``); the objective is unchanged.

    Per gated group the guide samples ``tries`` responses to the prompt [ours: 4] and the first the verifier judges
    right replaces the group's last wrong row (none right: the group stays as it is — counted). The guide's
    response is teacher-forced through the *current* policy for its log-probabilities, so π_old is the policy's
    own (the ratio starts at 1, as for every other row), and the group is scored again (group-aware rewards see
    the new member). Runs first among the shaping stages (the length and dynamic-sampling stages then see the
    guided group). The slot is marked: ``completion.meta["guide"]`` and the record's ``extra["guide"]`` (the
    inspector shows a "guide" badge). Metrics: ``npo/groups_gated``, ``npo/groups_guided``,
    ``npo/guide_acceptance`` (guided / gated: how often the guide found a verified-correct response),
    ``npo/group_accuracy_before`` and ``_after`` (over the gated groups).

    The two-run recipe: train ahead, then restart an earlier checkpoint with ``rollout.guide: {from:
    RUN_DIR/checkpoints/step-K}``; the guide is loaded once. Automatic: ``{from: auto, delta: Δ}`` (Δ 10 [ours])
    trains the same run without guides Δ steps ahead in a second process (``mmrlvr.train.guide_run``) and loads its
    checkpoint t + Δ at step t. The guide is frozen and samples with the run's own sampling settings (seeded per
    step, prompt and try).
    """

    selected_by = ("rollout.guide",)
    reads = ("rollout.guide",)
    when_text = "rollout.guide is set"

    #: the guide's sampling seed key: steps never collide with the run's own samples
    GUIDE_KEY = 20_000_000

    @classmethod
    def when(cls, cfg) -> bool:
        return bool(cfg.rollout.guide)

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        return {f"rollout.guide.{k}": v for k, v in {**GUIDE_DEFAULTS, **cfg.rollout.guide}.items()}

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from pathlib import Path

        g, out = cfg.rollout.guide, []
        if not isinstance(g, dict):
            return [f"rollout.guide: expected {{from: CHECKPOINT_DIR, gate: 0.6}}, got {g!r}"]
        unknown = [k for k in g if k not in ("from", *GUIDE_DEFAULTS)]
        if unknown:
            out.append(f"rollout.guide: unknown key(s) {', '.join(map(str, unknown))}; accepted: from, "
                       f"{', '.join(GUIDE_DEFAULTS)}")
        src = g.get("from")
        delta = g.get("delta", GUIDE_DEFAULTS["delta"])
        if isinstance(delta, bool) or not isinstance(delta, int) or delta < 1:
            out.append(f"rollout.guide.delta: an integer >= 1 (steps the automatic guide runs ahead), got {delta!r}")
        if not isinstance(src, str) or not src:
            out.append("rollout.guide.from: the guide's checkpoint folder (RUN_DIR/checkpoints/step-K) or auto is "
                       "required")
        elif src != "auto":  # the folder itself is checked with this machine's files (mmrlvr.validation.guide_problems)
            folder = Path(src)
            own = (Path(cfg.output_dir) / "checkpoints").resolve()
            if folder.resolve().parent == own and cfg.keep_checkpoints > 0:
                out.append(f"rollout.guide.from: {src} is one of this run's own checkpoints and keep_checkpoints="
                           f"{cfg.keep_checkpoints} would prune it as the run saves newer ones (a resumed run needs "
                           "it again): set keep_checkpoints: 0 or copy the guide elsewhere")
        gate = g.get("gate", GUIDE_DEFAULTS["gate"])
        if isinstance(gate, bool) or not isinstance(gate, (int, float)) or not 0 < gate <= 1:
            out.append(f"rollout.guide.gate: a group accuracy in (0, 1], got {gate!r}")
        tries = g.get("tries", GUIDE_DEFAULTS["tries"])
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            out.append(f"rollout.guide.tries: an integer >= 1, got {tries!r}")
        return out

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from pathlib import Path

        g = {**GUIDE_DEFAULTS, **self.cfg.rollout.guide}
        self.gate, self.tries, self.source = float(g["gate"]), int(g["tries"]), str(g["from"])
        self.delta, self.run, self.loaded = int(g["delta"]), None, None
        if self.source != "auto":
            self.load(Path(self.source))

    def load(self, folder) -> None:
        """The guide model from a checkpoint folder (the base model, then the checkpoint's weights), frozen."""
        from mmrlvr.models.loading import load_policy
        from mmrlvr.models.placement import model_device
        from mmrlvr.rollout.hf import HFEngine
        from mmrlvr.train.checkpoint import load_trainable_into
        from mmrlvr.train.model_path import resolve_model_path

        model, _ = load_policy(resolve_model_path(self.cfg.model.path), dtype=self.cfg.model.dtype,
                               device=str(model_device(self.rt.policy)))
        self.guide = load_trainable_into(model, folder).eval().requires_grad_(False)
        self.engine = HFEngine(self.guide, self.rt.processor)
        self.loaded = str(folder)

    def current_guide(self, step: int) -> None:
        """Automatic guides: the guide run's checkpoint step + Δ, started (main process) and loaded as needed."""
        if self.source != "auto":
            return
        from mmrlvr.train.guide_run import GuideRun

        if self.run is None:
            self.run = GuideRun(self.cfg.output_dir, self.delta, self.cfg.max_steps, start=self.rt.is_main)
        folder = self.run.checkpoint(step)
        if str(folder) != self.loaded:
            self.load(folder)

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.rewards.combine import answer_judge
        from mmrlvr.rollout.base import SamplingParams

        cfg, rollouts = self.cfg, b.rollouts
        acc = row_accuracy(b)
        if acc is None:  # no gold answers: nothing can be verified correct
            return
        self.current_guide(b.step)
        params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)
        gated = guided = 0
        before, after = [], []
        for span in rollouts.group_slices():
            group_acc = float(acc[span].mean())
            if group_acc >= self.gate:
                continue
            gated += 1
            before.append(group_acc)
            sample = rollouts.samples[span.start]
            tries = self.engine.generate([sample], self.tries, params, seed=cfg.seed,
                                         step=b.step + b.round * 10_000_000 + self.GUIDE_KEY)
            hit = next((j for j, c in enumerate(tries.completions) if answer_judge(c, sample)[0]), None)
            wrong = [r for r in range(span.start, span.stop) if acc[r] < 1.0]
            if hit is None or not wrong:
                after.append(group_acc)
                continue
            guided += 1
            n = int(tries.response_mask[hit].sum())
            self.place(b, wrong[-1], tries.response_ids[hit, :n], tries.completions[hit])
            acc[wrong[-1]] = 1.0
            after.append(float(acc[span].mean()))
        if gated:
            self.rescore(b, [s for s in rollouts.group_slices() if any(
                rollouts.completions[r].meta.get("guide") for r in range(s.start, s.stop))])
        b.diagnostics.update({"npo/groups_gated": Metric.sum(float(gated)), "npo/groups_guided": Metric.sum(float(guided)),
                              "npo/guide_acceptance": Metric.mean(guided / gated if gated else 0.0, n=gated)})
        if before:
            b.diagnostics.update({"npo/group_accuracy_before": Metric.mean(sum(before) / len(before), n=len(before)),
                                  "npo/group_accuracy_after": Metric.mean(sum(after) / len(after), n=len(after))})

    def place(self, b: StepBatch, row: int, response: torch.Tensor, completion) -> None:
        """Row ``row`` becomes ``response`` (the guide's tokens, EOS included): ids, masks, the completion, and
        π_old from the current policy, teacher-forced. Every response field is re-padded when it is longer."""
        from mmrlvr.train.forward import prefix_sharing, token_logprobs

        rt, r = self.rt, b.rollouts
        P, L, n = r.prompt_length, r.response_ids.shape[1], int(response.shape[0])
        tok = getattr(rt.processor, "tokenizer", rt.processor)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        if n > L:  # widen every [N, L] and [N, P + L] field
            grow = n - L
            r.response_ids = torch.nn.functional.pad(r.response_ids, (0, grow), value=pad)
            r.response_mask = torch.nn.functional.pad(r.response_mask, (0, grow))
            r.old_logprobs = torch.nn.functional.pad(r.old_logprobs, (0, grow))
            r.input_ids = torch.nn.functional.pad(r.input_ids, (0, grow), value=pad)
            r.attention_mask = torch.nn.functional.pad(r.attention_mask, (0, grow))
            for key, value in r.vision.items():
                if torch.is_tensor(value) and value.dim() == 2 and value.shape[1] == P + L:
                    r.vision[key] = torch.nn.functional.pad(value, (0, grow))
            extra = getattr(b.vision, "extra", None)  # the vision cache keeps its own per-token entries
            for key, value in (extra or {}).items():
                if torch.is_tensor(value) and value.dim() == 2 and value.shape[1] == P + L:
                    extra[key] = torch.nn.functional.pad(value, (0, grow))
            b.token_weights = torch.nn.functional.pad(b.token_weights, (0, grow))
            L = n
        r.response_ids[row] = pad
        r.response_ids[row, :n] = response
        r.response_mask[row] = 0.0
        r.response_mask[row, :n] = 1.0
        r.input_ids[row, P:] = r.response_ids[row]
        r.attention_mask[row, P:] = r.response_mask[row].long()
        completion.meta["guide"] = {"from": self.loaded}
        completion.meta["group_index"] = int(r.group_index[row])
        r.completions[row] = completion
        b.token_weights[row] = r.response_mask[row]
        rt.model.eval()
        with torch.no_grad():  # π_old of the guide's tokens: the current policy, as for every sampled row
            lp, _ = token_logprobs(rt.policy, rt.inputs(r, b.vision, b.images_per_row, slice(row, row + 1)),
                                   r.response_ids[row:row + 1], self.cfg.rollout.temperature)
        r.old_logprobs[row] = torch.where(r.response_mask[row] > 0, lp[0].float(), torch.zeros_like(lp[0]).float())

    def rescore(self, b: StepBatch, spans: list) -> None:
        """Score the guided groups again (group-aware rewards see their new member)."""
        from mmrlvr.rewards.base import score_batch

        r = b.rollouts
        for span in spans:
            rows = list(range(span.start, span.stop))
            res = score_batch(self.rt.reward, [r.completions[i] for i in rows], [r.samples[i] for i in rows],
                              group_index=[int(r.group_index[i]) for i in rows])
            from mmrlvr.rewards.combine import judge_rows

            judge_rows(res, [r.completions[i] for i in rows], [r.samples[i] for i in rows])
            for i, result in zip(rows, res):
                b.results[i] = result
                b.rewards[i] = float(result.score)
