"""The NLI consistency judge with a real (tiny, random, offline) sequence classifier.

This checks plumbing and label mapping — premise/hypothesis construction, truncation, id2label lookup,
save/reload through the Auto classes — not NLI accuracy.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
)

from mmrlvr.consistency import ConsistencyReward, NLIJudge, build_judge
from mmrlvr.errors import UserError
from mmrlvr.types import Completion, Sample

CORPUS = ["How many red shapes are there?", "I see 2 red, 1 blue.", "The final answer is 2.",
          "the answer is three so it is 3", "green blue yellow circle square triangle"] * 4
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_nli(folder: Path, id2label: dict[int, str], bias: list[float] | None = None, seed: int = 0) -> Path:
    """A 1-layer BERT classifier + a WordPiece tokenizer trained here, saved like a real checkpoint."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=120, special_tokens=SPECIALS))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=128)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=len(id2label),
                        initializer_range=0.5,  # large random weights: outputs that depend on the input
                        id2label=id2label, label2id={v: k for k, v in id2label.items()})
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    if bias is not None:  # a constant classifier: P(label) = softmax(bias) whatever the text
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.copy_(torch.tensor(bias))
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


SAMPLE = Sample(id="c", messages=[{"role": "user", "content": [{"type": "image"}, {
    "type": "text", "text": "How many red shapes are there?"}]}], images=[], answer="2", answer_type="number",
    meta={"task": "count", "colour": "red"})


def test_entail_probability_from_the_label_map(tmp_path):
    # entailment is label 2 here; logits (0, 0, ln 3) -> P(entail) = 3 / (1 + 1 + 3) = 0.6
    folder = build_nli(tmp_path / "nli", {0: "contradiction", 1: "neutral", 2: "ENTAILMENT"},
                       bias=[0.0, 0.0, math.log(3.0)])
    judge = build_judge("nli", path=str(folder))
    assert isinstance(judge, NLIJudge) and judge.entail_index == 2
    rows = [Completion("<think>I see 2 red, 1 blue.</think><answer>2</answer>"),
            Completion("<answer>2</answer>"),  # no thinking: cannot judge
            Completion("<think>I see 2 red.</think>")]  # no answer: cannot judge
    p = judge.p_consistent(rows, [SAMPLE] * 3)
    assert p[0] == pytest.approx(0.6, abs=1e-6)
    assert p[1:] == [None, None]


def test_premise_and_hypothesis_reach_the_model(tmp_path):
    folder = build_nli(tmp_path / "nli", {0: "entailment", 1: "neutral", 2: "contradiction"}, seed=1)
    judge = NLIJudge(folder)
    text = "<think>I see 2 red, 1 blue.</think><answer>2</answer>"
    assert judge.pairs([Completion(text)], [SAMPLE]) == [
        ("How many red shapes are there?\nI see 2 red, 1 blue.", "The final answer is 2.")]
    # the same pair through a separately reloaded checkpoint gives the same P(entail) (index 0 here)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    enc = tok(["How many red shapes are there?\nI see 2 red, 1 blue."], ["The final answer is 2."],
              return_tensors="pt")
    with torch.no_grad():
        want = model(**enc).logits.softmax(-1)[0, 0].item()
    assert judge.p_consistent([Completion(text)], [SAMPLE])[0] == pytest.approx(want, abs=1e-6)
    # a different answer is a different hypothesis, so (with random weights) a different probability
    other = judge.p_consistent([Completion(text.replace("<answer>2", "<answer>3"))], [SAMPLE])[0]
    assert other != pytest.approx(want, abs=1e-9)


def test_long_premise_is_truncated_not_the_hypothesis(tmp_path):
    folder = build_nli(tmp_path / "nli", {0: "not_entailment", 1: "entailment"}, bias=[0.0, 0.0])
    judge = NLIJudge(folder, max_length=24)
    assert judge.entail_index == 1  # "not_entailment" does not start with "entail"
    long = "<think>" + "I see 2 red, 1 blue. " * 40 + "</think><answer>2</answer>"
    assert judge.p_consistent([Completion(long)], [SAMPLE]) == [pytest.approx(0.5)]
    enc = judge.tokenizer(*judge.pairs([Completion(long)], [SAMPLE])[0], truncation="only_first", max_length=24)
    assert len(enc["input_ids"]) == 24
    hyp = judge.tokenizer("The final answer is 2.", add_special_tokens=False)["input_ids"]
    assert enc["input_ids"][-len(hyp) - 1:-1] == hyp


def test_label_map_errors_and_explicit_label(tmp_path):
    folder = build_nli(tmp_path / "nli", {0: "LABEL_0", 1: "LABEL_1"}, bias=[0.0, math.log(4.0)])
    with pytest.raises(UserError, match="entail_label"):
        NLIJudge(folder)
    judge = NLIJudge(folder, entail_label="LABEL_1")  # P = 4 / (1 + 4) = 0.8
    text = "<think>I see 2 red.</think><answer>2</answer>"
    assert judge.p_consistent([Completion(text)], [SAMPLE])[0] == pytest.approx(0.8, abs=1e-6)
    with pytest.raises(UserError, match="not a model folder"):
        NLIJudge(tmp_path / "missing")


def test_reward_with_nli_judge(tmp_path):
    folder = build_nli(tmp_path / "nli", {0: "contradiction", 1: "neutral", 2: "entailment"},
                       bias=[0.0, 0.0, math.log(3.0)])
    reward = ConsistencyReward(variant="accurate_only", judge="nli", judge_params={"path": str(folder)})
    right = reward(Completion("<think>I see 2 red, 1 blue.</think><answer>2</answer>"), SAMPLE)
    assert right.score == pytest.approx(0.6)  # p * [answer correct]
    assert right.parsed["verdict_source"] == "rule" and right.parsed["judge"] == "nli"
    wrong = reward(Completion("<think>I see 2 red, 1 blue.</think><answer>3</answer>"), SAMPLE)
    assert wrong.score == 0.0
    # no conclusion the rule can find: the verdict falls back to the judge (0.6 >= 0.5)
    vague = reward(Completion("<think>Let me look at the picture.</think><answer>2</answer>"), SAMPLE)
    assert (vague.parsed["verdict"], vague.parsed["verdict_source"]) == ("consistent", "nli")
