"""Generate: which prompts (the sampler), their G responses each (the rollout strategy), the vision cache.

``groups`` (the default) takes this process's contiguous share of the step's global prompt batch (the sampler
``rollout.sampler``, ``mmrlvr.train.samplers``; the default ``uniform`` is a pure function of seed and step),
samples G responses per prompt with the rollout engine (seeded per seed, step, prompt and sample), and starts the
loss weights as the response mask. A majority-vote reward with ``votes: V`` asks for V per prompt instead
(``mmrlvr.train.reward_setup.samples_per_prompt``; TTRL's vote/train split): all V are scored, and the
``vote_split`` shape stage keeps G of them for training. After the step the sampler observes every prompt's rewards
(all V with votes; gathered from every process) and its state goes into checkpoints.
With a frozen vision tower it also builds the step's ``VisionFeatureCache``: the tower runs once per distinct
prompt and every later pass (credit, reference, update) reuses its features (exact while the tower is frozen).
"""

from __future__ import annotations

import time
from typing import Any

from mmrlvr.metric import Metric
from mmrlvr.run_settings import TREE_DEFAULTS, tree_params
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.data import shard
from mmrlvr.train.stages.base import Stage, register_stage
from mmrlvr.train.tool_setup import TOOL_DEFAULTS, multi_turn, summarize_of, tool_use


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
                "rollout.temperature": r.temperature, **cls._votes_setting(cfg)}

    @staticmethod
    def _votes_setting(cfg) -> dict[str, Any]:
        """The samples drawn per prompt when a majority vote's ``votes`` asks for more than ``rollout.group_size``."""
        from mmrlvr.train.reward_setup import samples_per_prompt

        n = samples_per_prompt(cfg)
        return {"samples per prompt (votes)": n} if n != cfg.rollout.group_size else {}

    @classmethod
    def validate(cls, cfg) -> list[str]:
        """A sampler that sizes groups splits its budget evenly across processes: the budget must divide."""
        from mmrlvr.train.samplers import sampler_class

        cls = sampler_class(cfg)
        if not cls.sizes_groups:
            return []
        from mmrlvr.methods import configured
        from mmrlvr.train.distributed import expected_world_size

        world, how = expected_world_size()
        budget = cls.step_budget(cfg, configured(cfg, "sampler")[1])
        out = []
        if world > 1 and budget % world:
            out.append(f"rollout.sampler_params.budget: {budget} samples per step do not split evenly over {world} "
                       f"processes ({how}); each process allocates an equal share: choose a multiple of {world}")
        shape = cfg.stages.shape if isinstance(cfg.stages.shape, list) else [cfg.stages.shape]
        from mmrlvr.train.stages.shape import dynamic_sampling_params

        refills = ((cfg.algo.dynamic_sampling or "dynamic_sampling" in shape)
                   and dynamic_sampling_params(cfg)["max_rounds"] > 1)
        if world > 1 and refills:
            from mmrlvr.train.distributed import one_process_only

            out += one_process_only(f"rollout.sampler: {cfg.rollout.sampler} with dynamic-sampling refill rounds",
                                    "refilled groups of other sizes would leave the processes with different row "
                                    "counts; set algo.dynamic_sampling_params.max_rounds: 1")
        return out

    #: refill round r samples with the engine's seed key step + r * ROUND_KEY, so its responses never repeat
    #: round 0's (the engine seeds per seed, step, prompt and sample)
    ROUND_KEY = 10_000_000

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.methods import configured
        from mmrlvr.train.samplers import build_sampler

        name, params = configured(self.cfg, "sampler")
        self.sampler = build_sampler(name, len(rt.train_samples), self.cfg.rollout.prompts_per_step, self.cfg.seed,
                                     params, group_size=self.cfg.rollout.group_size)
        from mmrlvr.train.reward_setup import samples_per_prompt

        # rollout.group_size, or a majority vote's `votes` (TTRL: vote over more samples than train; the
        # vote_split shape stage keeps rollout.group_size of them after scoring)
        self.per_prompt = samples_per_prompt(self.cfg)
        self._index = {id(s): i for i, s in enumerate(rt.train_samples)}  # sample -> dataset index
        if hasattr(self.sampler, "set_difficulty"):  # SGAC's fourth feature, from the data (not checkpointed)
            from mmrlvr.train.samplers import prompt_difficulty

            self.sampler.set_difficulty(prompt_difficulty(rt.train_samples))

    def prompts(self, step: int, round: int = 0, diagnostics: dict[str, float] | None = None
                ) -> tuple[list, list[int] | None]:
        """This process's share of step ``step``'s prompts (round r > 0: a refill round's), and their group sizes
        when the sampler sizes groups (``group_sizes``; each process allocates its even share of the budget, so
        every rank holds the same number of rows), else None (``rollout.group_size`` each). A sampler that
        probes (``probe_candidates``) has its candidates probed first; its ``step_metrics`` go to
        ``diagnostics`` (every process's sampler holds the same state: a plain value is the same everywhere)."""
        rt = self.rt
        probed = self.probe(step, round, diagnostics)
        idx = shard(self.sampler.indices(step, round), rt.accel.process_index, rt.accel.num_processes)
        sizes = None
        if self.sampler.sizes_groups:
            sizes = self.sampler.group_sizes(idx, self.sampler.budget // rt.accel.num_processes)
        if diagnostics is not None:
            diagnostics.update({k: v if isinstance(v, Metric) else Metric.same(float(v))
                                for k, v in self.sampler.step_metrics(step, round).items()})
            if probed is not None:
                diagnostics["sampler/probe_samples"] = Metric.same(float(probed))
        return [rt.train_samples[i] for i in idx], sizes

    #: a probe samples with the engine's seed key step + PROBE_KEY: its responses never repeat a step's own
    PROBE_KEY = 1_000_000_000_000

    def probe(self, step: int, round: int, diagnostics: dict[str, float] | None = None) -> int | None:
        """Probe the sampler's candidates before the step: ``probe_samples`` responses each (at most
        ``probe_tokens`` new tokens), judged by the verifier alone (no reward call: no reward counters move, a
        group-aware reward is not handed groups of another size), their outcomes gathered from every process (in
        rank order) for ``observe_probe``. The global list is padded to a multiple of the processes (the padding
        repeats candidates, observed once), so every rank makes the same engine call. Returns the samples drawn
        (over every process, padding left out), or None for a sampler that does not probe."""
        from mmrlvr.train.samplers import Sampler, StepOutcome

        k = int(getattr(self.sampler, "probe_samples", 0) or 0)
        if k <= 0 or type(self.sampler).probe_candidates is Sampler.probe_candidates:
            return None
        cands = list(dict.fromkeys(self.sampler.probe_candidates(step, round)))
        if not cands:
            return 0
        import torch

        from mmrlvr.rollout.base import SamplingParams
        from mmrlvr.train.batch import StepBatch
        from mmrlvr.train.distributed import _all_gather

        rt, r = self.rt, self.cfg.rollout
        world, rank = rt.accel.num_processes, rt.accel.process_index
        padded = cands + [cands[j % len(cands)] for j in range(-len(cands) % world)]
        mine = shard(padded, rank, world)
        t0 = time.perf_counter()
        rt.model.eval()
        params = SamplingParams(max_new_tokens=int(getattr(self.sampler, "probe_tokens", 0) or 0) or r.max_new_tokens,
                                temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
        rollouts = self.sample([rt.train_samples[i] for i in mine], k, params, step + self.PROBE_KEY)
        from mmrlvr.rewards.combine import judge_rows
        from mmrlvr.types import RewardResult

        pb = StepBatch(step=step, rollouts=rollouts, rewards=torch.zeros(rollouts.num_rows),
                       results=[RewardResult(0.0) for _ in range(rollouts.num_rows)])
        judge_rows(pb.results, rollouts.completions, rollouts.samples)  # the verifier alone: no reward call
        prompts, _, accuracy, answers = self._outcome([pb])
        parts = _all_gather((prompts, accuracy, answers), world)
        gold = all(p[1] is not None for p in parts)  # every rank's rows carry a gold answer
        groups: dict[int, tuple[list, list]] = {}
        for p_idx, acc, ans in parts:
            for j, i in enumerate(p_idx):
                groups.setdefault(i, (acc[j] if gold else [0.0] * len(ans[j]), ans[j]))  # the padding's repeat: once
        accs = [a for a, _ in groups.values()]
        self.sampler.observe_probe(StepOutcome(step, list(groups), accs, accs if gold else None,
                                               [ans for _, ans in groups.values()]))
        if diagnostics is not None:
            diagnostics["time/probe_s"] = Metric.max(time.perf_counter() - t0)
        return len(cands) * k

    def after_step(self, b: StepBatch) -> None:
        """The sampler observes every group the step generated — each refill round's too, kept or dropped by
        dynamic sampling (``StepBatch.generated_rounds``) — gathered from every process (in rank order)."""
        from mmrlvr.train.distributed import _all_gather
        from mmrlvr.train.samplers import Sampler, StepOutcome

        if type(self.sampler).observe is Sampler.observe or b.rollouts is None or b.rewards is None:
            return  # a sampler that learns nothing needs no gather
        mine = self._outcome(b.generated_rounds())
        parts = _all_gather(mine, self.rt.accel.num_processes)
        accuracy = None if any(p[2] is None for p in parts) else [a for p in parts for a in p[2]]
        self.sampler.observe(StepOutcome(b.step, [i for p in parts for i in p[0]], [r for p in parts for r in p[1]],
                                         accuracy, [a for p in parts for a in p[3]]))

    def _outcome(self, rounds: list[StepBatch]) -> tuple[list, list, list | None, list]:
        """(prompt indices, rewards, accuracy or None, final answers) per group over ``rounds``, in order."""
        from mmrlvr.train.stages.shape import row_accuracy

        prompts, rewards, accuracy, answers = [], [], [], []
        for rb in rounds:
            rows, spans = rb.rollouts.samples, rb.rollouts.group_slices()  # groups may differ in size
            prompts += [self._index.get(id(rows[s.start]), -1) for s in spans]
            rewards += [rb.rewards[s].tolist() for s in spans]
            acc = row_accuracy(rb)
            accuracy = None if acc is None or accuracy is None else accuracy + [acc[s].tolist() for s in spans]
            texts = [self.final_answer(c.text) for c in rb.rollouts.completions]
            answers += [texts[s] for s in spans]
        return prompts, rewards, accuracy, answers

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

    def sampling_params(self, b: StepBatch):
        """The run's sampling settings for this step; a truncated-rollout distillation entry caps the length
        (``rollout_token_cap``, logged as ``rollout/token_cap`` when it cuts)."""
        from mmrlvr.rollout.base import SamplingParams
        from mmrlvr.train.aux_losses import rollout_token_cap

        r = self.cfg.rollout
        cap = rollout_token_cap(self.cfg, b.step) if self.cfg.algo.aux_losses else r.max_new_tokens
        if cap < r.max_new_tokens:
            b.diagnostics["rollout/token_cap"] = Metric.same(float(cap))
        return SamplingParams(max_new_tokens=cap, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)

    def sample(self, samples: list, group_size: int, params, step_key: int):
        """``group_size`` responses to each of ``samples`` (a ``RolloutBatch``) from the rollout engine."""
        return self.rt.engine.generate(samples, group_size, params, seed=self.cfg.seed, step=step_key)

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.train.forward import VisionFeatureCache

        cfg, rt = self.cfg, self.rt
        b.samples, sizes = self.prompts(b.step, b.round, b.diagnostics)
        params = self.sampling_params(b)
        rt.model.eval()
        t0 = time.perf_counter()
        step_key = b.step + b.round * self.ROUND_KEY
        if sizes is None:
            rollouts = self.sample(b.samples, self.per_prompt, params, step_key)
        else:  # one engine call per group size, joined (samples are seeded per prompt and index: order-free)
            from mmrlvr.rollout.merge import concat_rollouts

            by_size: dict[int, list] = {}
            for sample, g in zip(b.samples, sizes):
                by_size.setdefault(g, []).append(sample)
            pieces = [self.sample(by_size[g], g, params, step_key) for g in sorted(by_size)]
            tok = getattr(rt.processor, "tokenizer", rt.processor)
            rollouts = concat_rollouts(pieces, pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
            rollouts.timings = {k: sum(p.timings.get(k, 0.0) for p in pieces) for k in pieces[0].timings}
            b.samples = [s for g in sorted(by_size) for s in by_size[g]]
            b.diagnostics["sampler/samples"] = Metric.sum(float(sum(sizes)))
        for i, c in zip(rollouts.group_index.tolist(), rollouts.completions):
            c.meta["group_index"] = i  # rewards that group by completion read it (groups may differ in size)
        b.diagnostics["rollout/samples"] = Metric.sum(float(rollouts.num_rows))
        # positions decoded: every row runs until its engine call's longest response ends
        b.diagnostics["rollout/decoded_tokens"] = Metric.sum(float(rollouts.num_rows * rollouts.response_ids.shape[1])
                                                             if sizes is None else
                                                             float(sum(p.num_rows * p.response_ids.shape[1]
                                                                       for p in pieces)))
        rollouts.timings.setdefault("generate_s", time.perf_counter() - t0)
        rollouts.timings["step"] = b.step
        b.rollouts = rollouts
        b.images_per_row = rollouts.images_per_row(rt.vision_start_id)
        if cfg.model.freeze_vision:
            vision = VisionFeatureCache(rt.policy, rollouts.vision, b.images_per_row, rollouts.rows_sharing_images(),
                                        features=rollouts.image_features)
            b.vision = vision if vision.ok else None
        b.token_weights = rollouts.response_mask.clone()


#: tree strategy parameters and their defaults (segment_length 0: max_new_tokens // depth)
@register_stage("generate", "tree")
class TreeRollouts(FlatGroups):
    """TreeRPO trees (``mmrlvr.rollout.tree``): per prompt branching^depth leaves that share their prompt and
    upper segments, each computed once through a growing KV cache. The leaves are the prompt's group."""

    selected_by = ("rollout.strategy",)
    fallback = False
    reads = ("rollout.",)
    when_text = "rollout.strategy: tree"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.rollout.strategy == "tree"

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        out = FlatGroups.plan_params(cfg)
        out.pop("rollout.group_size", None)
        p = tree_params(cfg)
        out.update({"rollout.strategy": "tree", **{f"rollout.strategy_params.{k}": v for k, v in p.items()},
                    "leaves per prompt": p["branching"] ** p["depth"]})
        return out

    @classmethod
    def validate(cls, cfg) -> list[str]:
        out = FlatGroups.validate(cfg)
        given = cfg.rollout.strategy_params or {}
        unknown = [k for k in given if k not in TREE_DEFAULTS]
        if unknown:
            out.append(f"rollout.strategy_params: unknown key(s) {', '.join(map(str, unknown))} of the tree strategy; "
                       f"accepted: {', '.join(TREE_DEFAULTS)}")
        for key, low in (("depth", 1), ("branching", 2), ("segment_length", 0)):
            v = given.get(key, TREE_DEFAULTS[key])
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                out.append(f"rollout.strategy_params.{key}: an integer >= {low}, got {v!r}")
        if cfg.rollout.engine != "hf":
            out.append(f"rollout.strategy: tree samples with the hf engine's shared KV cache; rollout.engine "
                       f"{cfg.rollout.engine!r} is not supported with it yet")
        from mmrlvr.train.samplers import sampler_class

        if sampler_class(cfg).sizes_groups:
            out.append(f"rollout.strategy: tree fixes each prompt's group (branching^depth leaves); rollout.sampler: "
                       f"{cfg.rollout.sampler} sizes groups: choose one")
        return out

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.rollout.tree import generate_tree
        from mmrlvr.train.forward import VisionFeatureCache

        cfg, rt = self.cfg, self.rt
        b.samples, _ = self.prompts(b.step, b.round, b.diagnostics)
        p = tree_params(cfg)
        params = self.sampling_params(b)
        rt.model.eval()
        t0 = time.perf_counter()
        rollouts, b.tree = generate_tree(rt.engine, b.samples, params, depth=p["depth"], branching=p["branching"],
                                         segment_length=p["segment_length"], seed=cfg.seed,
                                         step=b.step + b.round * self.ROUND_KEY)
        for i, c in zip(rollouts.group_index.tolist(), rollouts.completions):
            c.meta["group_index"] = i
        rollouts.timings["generate_s"] = time.perf_counter() - t0
        rollouts.timings["step"] = b.step
        b.rollouts = rollouts
        b.images_per_row = rollouts.images_per_row(rt.vision_start_id)
        if cfg.model.freeze_vision:
            vision = VisionFeatureCache(rt.policy, rollouts.vision, b.images_per_row, rollouts.rows_sharing_images())
            b.vision = vision if vision.ok else None
        b.token_weights = rollouts.response_mask.clone()
        b.diagnostics["rollout/samples"] = Metric.sum(float(rollouts.num_rows))
        # positions decoded: each depth's rows times its segment (the prompt is prefilled once per tree)
        b.diagnostics["rollout/decoded_tokens"] = Metric.sum(float(sum(p["branching"] ** (d + 1) * n
                                                                       for d, n in enumerate(b.tree.lengths))
                                                                   * len(b.samples)))


@register_stage("generate", "multi_turn")
class MultiTurnRollouts(FlatGroups):
    """Multi-turn trajectories with tools (``mmrlvr.rollout.multiturn``): the model may call the tools of
    ``rollout.tools`` in ``<tool_call>`` blocks; each answer (text and images) comes back as a tool turn and the
    model continues, up to ``rollout.max_turns`` turns and ``rollout.max_trajectory_tokens`` tokens. Tool turns
    carry no loss; prompts are drawn and grouped as in ``groups`` (any sampler)."""

    selected_by = ("rollout.tools", "rollout.summarize")
    fallback = False
    reads = ("rollout.",)
    when_text = "rollout.tools: [...] or rollout.summarize: {at_tokens: N}"

    @classmethod
    def when(cls, cfg) -> bool:
        return multi_turn(cfg)

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        r = cfg.rollout
        summary = {f"rollout.summarize.{k}": v for k, v in (r.summarize or {}).items() if k == "at_tokens"}
        return {**FlatGroups.plan_params(cfg), **summary, "rollout.tools": list(r.tools), "rollout.max_turns": r.max_turns,
                "rollout.max_trajectory_tokens": r.max_trajectory_tokens,
                **{f"rollout.tool_params.{k}": v for k, v in {**TOOL_DEFAULTS, **(r.tool_params or {})}.items()}}

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from mmrlvr.errors import did_you_mean
        from mmrlvr.tools import TOOLS

        r = cfg.rollout
        out = FlatGroups.validate(cfg)
        if not isinstance(r.tools, list) or not all(isinstance(t, str) for t in r.tools):
            return out + [f"rollout.tools: a list of tool names, got {r.tools!r}"]
        for name in r.tools:
            if name not in TOOLS.names():
                out.append(f"rollout.tools: unknown tool {name!r}{did_you_mean(name, TOOLS.names())}; known: "
                           f"{', '.join(TOOLS.names())} (a plug-in registers more with @register_tool)")
        if len(set(r.tools)) != len(r.tools):
            out.append(f"rollout.tools: a tool is listed twice: {r.tools}")
        for key, value, low in (("max_turns", r.max_turns, 1), ("max_trajectory_tokens", r.max_trajectory_tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                out.append(f"rollout.{key}: an integer >= {low}, got {value!r}")
        given = r.tool_params or {}
        unknown = [k for k in given if k not in TOOL_DEFAULTS]
        if unknown:
            out.append(f"rollout.tool_params: unknown key(s) {', '.join(map(str, unknown))}; accepted: "
                       f"{', '.join(TOOL_DEFAULTS)}")
        for key in ("time_budget_s", "max_image_pixels"):
            v = given.get(key, TOOL_DEFAULTS[key])
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                out.append(f"rollout.tool_params.{key}: a number > 0, got {v!r}")
        if not isinstance(given.get("describe", True), bool):
            out.append(f"rollout.tool_params.describe: true or false, got {given['describe']!r}")
        if r.strategy != "groups":
            out.append(f"rollout.tools: multi-turn trajectories are sampled as flat groups; rollout.strategy "
                       f"{r.strategy!r} cannot be combined with tools")
        if r.guide:
            out.append("rollout.guide: a guide response is one turn; it cannot be combined with rollout.tools")
        return out + cls._validate_summarize(cfg)

    @staticmethod
    def _validate_summarize(cfg) -> list[str]:
        given = cfg.rollout.summarize or {}
        if not given:
            return []
        out = []
        if not isinstance(given, dict):
            return [f"rollout.summarize: a mapping like {{at_tokens: 512}}, got {given!r}"]
        unknown = [k for k in given if k not in ("at_tokens", "instruction", "restart")]
        if unknown:
            out.append(f"rollout.summarize: unknown key(s) {', '.join(map(str, unknown))}; accepted: at_tokens, "
                       "instruction, restart")
        at = given.get("at_tokens")
        if isinstance(at, bool) or not isinstance(at, int) or at < 1:
            out.append(f"rollout.summarize.at_tokens: the context length (tokens) at which the model summarises, an "
                       f"integer >= 1, got {at!r}")
        if "restart" in given and "{summary}" not in str(given["restart"]):
            out.append("rollout.summarize.restart: must contain {summary} (where the summary goes)")
        if cfg.rollout.max_turns < 3:
            out.append(f"rollout.max_turns: {cfg.rollout.max_turns} leaves no room to summarise (a turn before, the "
                       "summary, a turn after): set 3 or more with rollout.summarize")
        if cfg.algo.advantage in ("poise", "tree") or cfg.algo.loss == "popo" or cfg.consistency.split_advantage:
            out.append("rollout.summarize: segments share their trajectory's advantage, computed by the group "
                       "estimators (grpo, dr_grpo, rloo, reinforce_pp, pass_at_k, plug-ins); poise, popo and the "
                       "consistency split are not supported with it")
        from mmrlvr.train.distributed import expected_world_size, one_process_only

        if expected_world_size()[0] > 1:
            out += one_process_only("rollout.summarize", "a trajectory's segments are extra rows, so processes would "
                                    "hold different row counts")
        return out

    def __init__(self, rt) -> None:
        super().__init__(rt)
        self.use = tool_use(self.cfg)
        self.summarize = summarize_of(self.cfg)

    def sample(self, samples: list, group_size: int, params, step_key: int):
        from mmrlvr.rollout.multiturn import generate_multiturn

        return generate_multiturn(self.rt.engine, samples, group_size, params, self.use, seed=self.cfg.seed,
                                  step=step_key, summarize=self.summarize)

    def __call__(self, b: StepBatch) -> None:
        super().__call__(b)
        comps = b.rollouts.completions
        n = max(len(comps), 1)
        b.diagnostics["tools/turns_mean"] = Metric.mean(sum(c.meta.get("num_turns", 1) for c in comps) / n, n=len(comps))
        b.diagnostics["tools/calls_per_row"] = Metric.mean(sum(c.meta.get("tool_calls", 0) for c in comps) / n,
                                                           n=len(comps))
        from mmrlvr.tools.runner import ERROR_KINDS

        counts = self.use.counters.metrics()  # this step's calls and failures, by kind
        b.diagnostics["tools/calls"] = counts.get("tools/calls", Metric.sum(0.0))
        for kind in ERROR_KINDS:
            b.diagnostics[f"tools/{kind}"] = counts.get(f"tools/{kind}", Metric.sum(0.0))
