"""The record stage's per-token texts: each token id decoded once per tokenizer, the same strings as decoding it."""

import pytest

from mmrlvr.train.records import _token_texts


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from mmrlvr.models.compat import load_processor
    from mmrlvr.models.tiny import build_tiny

    path = build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m")
    return load_processor(path, "qwen2_5_vl").tokenizer


class _Counting:
    """A tokenizer that counts its decode calls."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def decode(self, ids):
        self.calls += 1
        return self.tok.decode(ids)


def test_token_texts_equal_decoding_each_token(tokenizer):
    ids = list(range(len(tokenizer)))  # every id, special and added tokens included
    assert _token_texts(tokenizer)(ids) == [tokenizer.decode([t]) for t in ids]


def test_each_id_is_decoded_once_per_tokenizer(tokenizer):
    counting = _Counting(tokenizer)
    texts = _token_texts(counting)
    row = [5, 9, 5, 5, 17]
    assert texts(row) == [tokenizer.decode([t]) for t in row]
    assert counting.calls == 3
    assert _token_texts(counting)(row + [9, 21]) == [tokenizer.decode([t]) for t in row + [9, 21]]
    assert counting.calls == 4  # only 21 was new
    other = _Counting(tokenizer)
    _token_texts(other)(row)
    assert other.calls == 3  # another tokenizer has its own texts
