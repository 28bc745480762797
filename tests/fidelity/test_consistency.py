"""Consistency split: the answer-span token mask on non-ASCII text, and the split advantage's formula.

Ground truth for the span is computed from bytes, not by decoding: a byte-level BPE token is a run of
bytes (GPT-2's byte-to-unicode table maps each back), so token j belongs to the answer exactly when the
bytes of tokens 0..j reach past the byte where the answer starts in the UTF-8 text.
"""

from __future__ import annotations

import pytest
import torch

from mmrlvr.algos import grpo_advantages, split_advantages, token_split_advantages
from mmrlvr.consistency.spans import answer_char_start, answer_token_mask

# Thinking full of multi-byte characters (° 2 bytes, π 2, × 2, Chinese 3, emoji 4), answers with them too.
RESPONSES = [
    "<think>The angle is 40°, so π/2 × 3 = 3π/2. 三个红色的🍎🍎🍎 and 2 blue ×× °°°</think><answer>40°</answer>",
    "<think>角度是四十度。答案是三。🙂🙂🙂🙂</think><answer>三 π×2</answer>",
    "<think>emoji 🍎🍎🍎🍎🍎🍎 then °</think>π 3",  # no answer tag: the answer starts after </think>
    "<think>plain ascii only</think><answer>2</answer>",
    "<think>二十°°°°°°°°°°°°</think><answer>×</answer>",
]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (what ByteLevel BPE tokens are spelt in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_U2B = {c: b for b, c in _bytes_to_unicode().items()}


def _token_nbytes(tok, token_id: int) -> int:
    if token_id in set(tok.all_special_ids):
        return 0  # skipped when decoding
    piece = tok.convert_ids_to_tokens(token_id)
    if all(ch in _U2B for ch in piece):
        return len(piece)  # one character per byte
    return len(piece.encode("utf-8"))  # an added token stored as plain text


def _expected_mask(tok, ids: list[int], text: str) -> list[float]:
    start = answer_char_start(text)
    if start is None:
        return [0.0] * len(ids)
    start_byte = len(text[:start].encode("utf-8"))
    out, end = [], 0
    for t in ids:
        end += _token_nbytes(tok, t)
        out.append(1.0 if end > start_byte else 0.0)
    return out


def _old_answer_token_mask(texts, response_ids, response_mask, tokenizer):
    """The pre-issue-14 method (per-token decode + character counting), kept to show what it got wrong."""
    N, L = response_ids.shape
    out = torch.zeros(N, L)
    for i, text in enumerate(texts):
        start = answer_char_start(text)
        if start is None:
            continue
        n = int((response_mask[i] > 0).sum())
        pieces = tokenizer.batch_decode([[t] for t in response_ids[i, :n].tolist()], skip_special_tokens=True)
        pos = 0
        for j, piece in enumerate(pieces):
            if pos + len(piece) > start:
                out[i, j:n] = 1.0
                break
            pos += len(piece)
    return out * (response_mask > 0)


def _batch(tok, texts, eos: int | None = None):
    rows = [tok(t, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else []) for t in texts]
    L = max(len(r) for r in rows) + 3  # right padding
    ids = torch.full((len(rows), L), tok.pad_token_id if tok.pad_token_id is not None else 0)
    mask = torch.zeros(len(rows), L)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return rows, ids, mask


def qwen_style_bpe():
    """A real byte-level BPE built like Qwen2's (Qwen's split pattern + ByteLevel, no tag tokens): the
    corpus makes ° and a few Chinese characters whole tokens and leaves the rest as byte pieces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from mmrlvr.models.tiny import QWEN_SPLIT_PATTERN

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    corpus = ["<think>the angle is 40° and the answer is 3</think><answer>3</answer>"] * 50
    corpus += ["角度 角度 是 三 个 °° 40° 90°"] * 30 + ["red blue think answer so the is and then emoji"] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def _tiny_tokenizers():
    from mmrlvr.models.tiny import FAMILIES, build_tokenizer, make_config, make_processor

    tok = build_tokenizer()
    out = []
    for family in FAMILIES:  # the trainer hands over the processor (or its tokenizer): test both
        out.append((f"{family}-processor", make_processor(family, tok, make_config(family, tok)), tok))
    out.append(("tiny-tokenizer", tok, tok))
    return out


@pytest.fixture(scope="module")
def tokenizers_under_test():
    return _tiny_tokenizers() + [("qwen-style-bpe", qwen_style_bpe(), None)]


def test_non_ascii_spans_match_the_byte_ground_truth(tokenizers_under_test):
    for name, decoder, tok in tokenizers_under_test:
        tok = tok or decoder
        rows, ids, mask = _batch(tok, RESPONSES, eos=tok.eos_token_id)
        got = answer_token_mask(RESPONSES, ids, mask, decoder)
        for i, (r, text) in enumerate(zip(rows, RESPONSES)):
            assert got[i, :len(r)].tolist() == _expected_mask(tok, r, text), (name, text)
            assert got[i, len(r):].sum() == 0, name  # padding never counts
        # the selected tokens decode to the answer text, plus at most the rest of a first token that
        # straddles the boundary (Qwen's BPE has pieces like "><"): no whole thinking token leaked in
        for i, text in enumerate(RESPONSES):
            sel = [t for t, m in zip(rows[i], got[i].tolist()) if m]
            answer = text[answer_char_start(text):]
            assert tok.decode(sel, skip_special_tokens=True).endswith(answer), (name, text)
            assert not tok.decode(sel[1:], skip_special_tokens=True).endswith(answer), (name, text)


def test_the_old_per_token_count_drifted_on_the_same_responses(tokenizers_under_test):
    # the defect this fixes: every split multi-byte character decodes to U+FFFD per piece, so counting
    # per-token lengths ran ahead and the boundary moved into the thinking
    for name, decoder, tok in tokenizers_under_test:
        tok = tok or decoder
        rows, ids, mask = _batch(tok, RESPONSES)
        old = _old_answer_token_mask(RESPONSES, ids, mask, decoder)
        wrong = [i for i, (r, t) in enumerate(zip(rows, RESPONSES)) if old[i, :len(r)].tolist() != _expected_mask(tok, r, t)]
        assert wrong, name
        assert 3 not in wrong  # ASCII-only responses were right before too


def test_texts_that_differ_from_the_decoding_cannot_shift_the_span():
    # the span is located in the tokenizer's own decoding of the ids, not in a cleaned-up string
    tok = qwen_style_bpe()
    text = RESPONSES[0]
    rows, ids, mask = _batch(tok, [text])
    got = answer_token_mask(["  " + text.upper()], ids, mask, tok)
    assert got[0, :len(rows[0])].tolist() == _expected_mask(tok, rows[0], text)


def test_split_advantage_formula_hand_worked():
    # CORA-style splitting: A = alpha * A_task + beta * A_cons, each GRPO-normalised in its group
    task = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    cons = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    alpha, beta = 1.0, 0.5

    def grpo(values):  # unbiased std, as DeepSeekMath / verl
        import statistics

        m, s = statistics.mean(values), statistics.stdev(values)
        return [0.0 if s == 0 else (v - m) / (s + 1e-6) for v in values]

    exp = []
    for idx in ([0, 1, 2], [3, 4, 5]):
        at, ac = grpo([float(task[i]) for i in idx]), grpo([float(cons[i]) for i in idx])
        exp += [alpha * a + beta * c for a, c in zip(at, ac)]
    assert torch.allclose(split_advantages(task, cons, g, alpha, beta), torch.tensor(exp), atol=1e-5)
    # token level: the consistency part reaches only the answer tokens of the mask
    m = torch.tensor([[0, 1.0], [0, 1], [1, 1], [0, 0], [0, 1], [1, 1]])
    tok = token_split_advantages(task, cons, g, m, alpha, beta)
    a_task = grpo_advantages(task, g)
    for i in range(6):
        for t in range(2):
            want = alpha * float(a_task[i]) + (exp[i] - alpha * float(a_task[i])) * float(m[i, t])
            assert abs(float(tok[i, t]) - want) < 1e-5
