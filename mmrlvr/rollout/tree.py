"""Tree rollouts (TreeRPO, arXiv 2506.05183): an N-ary tree of depth D per prompt, each node a segment of at most
L_seg tokens; the leaves (N^D per prompt) are the group's trajectories.

The shared parts are computed once, with one KV cache grown down the tree:

1. the prompt (image tokens included: the vision tower runs here, once per prompt) is prefilled once, all but its
   last token, into a cache;
2. depth d: the cache is repeated N times per row (``DynamicCache.batch_repeat_interleave``) and each row decodes
   its next segment of at most L_seg tokens with ``generate`` continuing from that cache — only the last token of
   the prefix and the new tokens run through the model; the cache it returns covers everything but the newest
   token, ready to be repeated for the next depth.

So a tree of depth D costs one prefill of P tokens and Σ_d N^d·L_seg decoded tokens, where flat groups of N^D
samples cost N^D prefills (or one repeated prefill) and N^D·D·L_seg decoded tokens.

Each row samples with its own generator (``RowSampler``), seeded by (seed, step, prompt id, the node's path), so
every process and a resumed run draw the same tree. A row that finished (EOS) in an earlier segment keeps decoding
(its tokens are masked afterwards, like finished rows in a flat group). ``TreeLayout`` records which node every
leaf passes through at each depth and where each depth's segment lies in the response, for the advantages
(``mmrlvr.algos.tree``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmrlvr.models.cache_arg import output_cache, with_cache
from mmrlvr.rollout.base import RolloutBatch, SamplingParams


@dataclass
class TreeLayout:
    """Where each leaf row's segments are. N = prompts x branching^depth rows (leaf order: prompt-major, then the
    path of child indices, as ``repeat_interleave`` lays them out).

    node:   [N, D] long, a global id of the node the row passes through at each depth (rows sharing a node share
            that segment's tokens); parent of a depth-d node = the row's depth-(d-1) node, of a depth-1 node the
            prompt (``group`` of the row);
    starts: D response positions where each depth's segment starts (the same for every row);
    lengths: D segment lengths in tokens (each <= segment_length; shorter when every row had stopped).
    """

    depth: int
    branching: int
    segment_length: int
    node: torch.Tensor
    starts: list[int]
    lengths: list[int]

    def parents(self, d: int, group_index: torch.Tensor) -> torch.Tensor:
        """[N] the parent of each row's depth-``d`` node (0-based d): the depth-(d-1) node, or the prompt."""
        return group_index if d == 0 else self.node[:, d - 1]


def _repeat_rope_deltas(model: torch.nn.Module, repeats: int) -> None:
    """Repeat the per-row rope deltas a Qwen-VL model stored at prefill (``rope_deltas`` [rows, 1]) for the rows
    the cache was just repeated into: its generate adds them to the text positions row by row."""
    for module in model.modules():
        deltas = getattr(module, "rope_deltas", None)
        if torch.is_tensor(deltas):
            module.rope_deltas = deltas.repeat_interleave(repeats, dim=0)


def generate_tree(engine: Any, samples: list, params: SamplingParams, *, depth: int, branching: int,
                  segment_length: int, seed: int, step: int) -> tuple[RolloutBatch, TreeLayout]:
    """The tree of every prompt in ``samples`` with an ``HFEngine`` (its model, processor, EOS / pad ids)."""
    from transformers import DynamicCache, LogitsProcessorList

    from mmrlvr.models.placement import model_device, to_model
    from mmrlvr.rollout.batch import assemble_batch
    from mmrlvr.rollout.hf import encode_prompt_batch, expand_vision
    from mmrlvr.rollout.sampling import RowSampler, row_seed

    model, processor = engine.model, engine.processor
    inputs = encode_prompt_batch(processor, samples)
    B = len(samples)
    images = [len(s.images) for s in samples]
    was_training = model.training
    model.eval()
    device = model_device(model)
    try:
        with torch.no_grad():
            feed = to_model(inputs, model)
            ids, mask = feed["input_ids"], feed["attention_mask"]
            cache = DynamicCache()
            P = ids.shape[1]
            extra = {k: (v[:, :-1] if torch.is_tensor(v) and v.dim() == 2 and v.shape == (B, P) else v)
                     for k, v in feed.items() if k not in ("input_ids", "attention_mask")}  # per-token: mm types
            # 1. the prompt once, all but its last token (generate feeds that one); the vision tower runs here
            model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], **with_cache(model, cache), use_cache=True, **extra)
            paths = [[()] for _ in range(B)]  # per prompt, the child-index path of each current row
            seg_tokens, seg_logps = [], []
            for d in range(depth):
                cache.batch_repeat_interleave(branching)
                _repeat_rope_deltas(model, branching)  # Qwen's 3D positions: one delta per row
                ids = ids.repeat_interleave(branching, dim=0)
                mask = mask.repeat_interleave(branching, dim=0)
                paths = [[p + (c,) for p in ps for c in range(branching)] for ps in paths]
                seeds = [row_seed(seed, step, f"{s.id}/tree/{'.'.join(map(str, p))}", d)
                         for s, ps in zip(samples, paths) for p in ps]
                sampler = RowSampler(seeds, params, device=device, banned_ids=engine.banned_ids)
                config = engine.generation_config(SamplingParams(max_new_tokens=segment_length,
                                                                  temperature=params.temperature,
                                                                  top_p=params.top_p, top_k=params.top_k))
                config.return_dict_in_generate = True  # the cache comes back with the sequences
                with engine.own_generation_defaults():
                    out = model.generate(input_ids=ids, attention_mask=mask, **with_cache(model, cache),
                                         generation_config=config, logits_processor=LogitsProcessorList([sampler]))
                new = out.sequences[:, ids.shape[1]:]
                length = new.shape[1]
                logp = torch.stack(sampler.logprobs[:length], dim=1).float() if length else new.float()
                seg_tokens.append(new)
                seg_logps.append(logp)
                cache = output_cache(out)
                ids = out.sequences
                mask = torch.cat([mask, torch.ones_like(new, dtype=mask.dtype)], dim=1)
    finally:
        model.train(was_training)
    leaves = branching ** depth
    n = B * leaves
    # every segment's tokens for every leaf (an earlier depth's row repeated for each leaf below it)
    response = torch.cat([t.repeat_interleave(branching ** (depth - 1 - d), dim=0) for d, t in enumerate(seg_tokens)],
                         dim=1).cpu()
    logprobs = torch.cat([lp.repeat_interleave(branching ** (depth - 1 - d), dim=0) for d, lp in enumerate(seg_logps)],
                         dim=1).cpu()
    lengths = [int(t.shape[1]) for t in seg_tokens]
    starts = [sum(lengths[:d]) for d in range(depth)]
    # node ids: at depth d, row r (leaf j of prompt b) passes through node (b, j // branching^(depth-1-d))
    rows = torch.arange(n)
    node = torch.stack([(rows // (branching ** (depth - 1 - d))) + d * n for d in range(depth)], dim=1)
    videos = [len(s.meta.get("videos") or []) for s in samples]
    vision = expand_vision(inputs, images, leaves, videos)
    batch = assemble_batch(samples, leaves, inputs, vision, response, logprobs, eos_ids=engine.eos_ids,
                           pad_id=engine.pad_id, tokenizer=engine.tokenizer)
    # a token after the row's first EOS (a segment decoded after the row had stopped) is masked by assemble_batch
    return batch, TreeLayout(depth, branching, segment_length, node, starts, lengths)
