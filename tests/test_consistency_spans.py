"""The answer-span consistency advantage (consistency.scope: answer): spans, the pure formula, the trainer."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.algos import grpo_advantages, token_split_advantages
from mmrlvr.config import load_config
from mmrlvr.consistency.spans import answer_char_start, answer_token_mask
from mmrlvr.errors import UserError


@pytest.mark.parametrize("text, expected", [
    ("<think>I see 2.</think><answer>2</answer>", 23),        # "<answer>" starts at 23 and belongs to it
    ("<think>so 3</think> 3", 19),                             # no answer tag: right after "</think>"
    ("<think>a <answer>1</answer> b</think><answer>2</answer>", 37),  # the final answer, not one quoted inside
    ("no tags at all", None),
    ("", None),
])
def test_answer_char_start(text, expected):
    assert answer_char_start(text) == expected


def test_answer_token_mask_on_the_real_tokenizer():
    from mmrlvr.models.tiny import build_tokenizer

    tok = build_tokenizer()
    texts = ["<think>I see 2 red, 1 blue.</think><answer>2</answer>", "<think>hm</think>3", "plain words"]
    rows = [tok(t)["input_ids"] for t in texts]
    L = max(len(r) for r in rows) + 2  # right padding
    ids = torch.full((3, L), tok.pad_token_id)
    mask = torch.zeros(3, L)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    m = answer_token_mask(texts, ids, mask, tok)
    pieces = [tok.decode([t]) for t in rows[0]]
    first = pieces.index("<answer>")  # tokens "<answer>", "2", "</answer>" and nothing before
    assert m[0, :first].sum() == 0 and m[0, first:len(rows[0])].tolist() == [1.0] * (len(rows[0]) - first)
    assert m[0, len(rows[0]):].sum() == 0  # padding never counts
    # "<think>hm</think>3": only the tokens after "</think>" (the "3")
    pieces1 = [tok.decode([t]) for t in rows[1]]
    assert m[1].tolist()[:len(rows[1])] == [0.0] * pieces1.index("</think>") + [0.0] + [1.0] * (
        len(rows[1]) - pieces1.index("</think>") - 1)
    assert m[2].sum() == 0  # no answer part: the consistency term reaches no token


def test_token_split_advantages_hand_worked():
    # one group of 4: task rewards [1, 0, 1, 0] -> mean 0.5, unbiased std 0.5774 -> A_task = ±0.866
    # consistency [1, 1, 0, 0] -> A_cons = [0.866, 0.866, -0.866, -0.866]
    task = torch.tensor([1.0, 0.0, 1.0, 0.0])
    cons = torch.tensor([1.0, 1.0, 0.0, 0.0])
    g = torch.zeros(4, dtype=torch.long)
    m = torch.tensor([[0, 0, 1.0], [0, 1, 1], [0, 0, 1], [1, 1, 1]])  # answer tokens per row
    a = token_split_advantages(task, cons, g, m, alpha=1.0, beta=0.5, eps=0.0)
    s = 0.5 / (1 / 3) ** 0.5  # 0.8660
    assert torch.allclose(a[0], torch.tensor([s, s, s + 0.5 * s]), atol=1e-5)
    assert torch.allclose(a[1], torch.tensor([-s, -s + 0.5 * s, -s + 0.5 * s]), atol=1e-5)
    assert torch.allclose(a[2], torch.tensor([s, s, s - 0.5 * s]), atol=1e-5)
    assert torch.allclose(a[3], torch.tensor([-s - 0.5 * s] * 3), atol=1e-5)
    # thinking tokens (mask 0) carry the task advantage alone
    assert torch.allclose(a[:, 0][m[:, 0] == 0], grpo_advantages(task, g, eps=0.0)[m[:, 0] == 0])


def test_split_defaults_and_scope_is_checked(tmp_path):
    cfg = load_config("configs/consistency-tiny.yaml")
    assert cfg.consistency.split_advantage is False and cfg.consistency.scope == "answer"
    on = load_config("configs/consistency-tiny.yaml", ["consistency.split_advantage=true"])
    assert on.consistency.split_advantage is True and on.consistency.scope == "answer"
    with pytest.raises(UserError, match="consistency.scope"):
        load_config("configs/consistency-tiny.yaml", ["consistency.scope=thinking"])
    with pytest.raises(UserError, match="consistency.split_advantage"):  # no consistency reward to split off
        load_config("configs/demo-tiny.yaml", ["consistency.split_advantage=true"])


def test_trainer_gives_thinking_tokens_the_task_advantage_only(tmp_path):
    """Two real steps on the noisy warm start; the stored per-token advantages show the split."""
    import pyarrow.parquet as pq

    from mmrlvr.train.trainer import Trainer

    cfg = load_config("configs/consistency-tiny.yaml", [
        f"output_dir={tmp_path}", "max_steps=2", "eval.at_start=false",
        "eval.at_end=false", "rollout.prompts_per_step=4", "tensorboard=false",
        "rewards.2.params.variant=plain", "consistency.split_advantage=true", "consistency.scope=answer"])
    Trainer(cfg).train()
    rows = pq.read_table(sorted((tmp_path / "rollouts").glob("*.parquet"))[0]).to_pylist()
    split_rows = 0
    for r in rows:
        toks, adv = r["response_tokens"], r["token_advantage"]
        if "<answer>" not in toks:
            assert len(set(adv)) <= 1  # no answer span: one advantage for every token
            continue
        k = toks.index("<answer>")
        assert len(set(adv[:k])) == 1 and len(set(adv[k:])) == 1  # thinking: one value; answer: one value
        split_rows += adv[0] != adv[k]
    assert split_rows > 0  # the consistency term moved some answers' advantage away from their thinking's


def test_unset_variant_is_agreement_only_under_the_answer_scope():
    base = ["rewards.2.params={judge: rule}"]  # the shipped config names its variant; unset it here
    # answer scope: agreement ("plain") cannot be earned by rewriting the thinking
    cfg = load_config("configs/consistency-tiny.yaml", base + ["consistency.split_advantage=true"])
    assert cfg.rewards[2].params["variant"] == "plain"
    # one advantage for every token (split off, or CORA's scope all): the reward's safe default stays
    for o in (["consistency.split_advantage=false"], ["consistency.split_advantage=true", "consistency.scope=all"]):
        assert "variant" not in load_config("configs/consistency-tiny.yaml", base + o).rewards[2].params
    # an explicit choice is never overridden
    cfg = load_config("configs/consistency-tiny.yaml", ["consistency.split_advantage=true"])
    assert cfg.rewards[2].params["variant"] == "accurate_only"
