"""The KV-cache keyword follows the installed transformers (``past_key_values`` up to 5.19, ``cache`` later): a wrong
name is silently dropped by ``forward(**kwargs)``, so the check is that the cache is really used."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.models.cache_arg import cache_keyword, output_cache, positions_cache_kwargs, with_cache


class _New(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, **kwargs):
        return input_ids


class _Old(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, **kwargs):
        return input_ids


class _Neither(torch.nn.Module):
    def forward(self, input_ids=None, **kwargs):
        return input_ids


def test_the_keyword_is_read_from_the_forward_signature():
    assert cache_keyword(_New()) == "cache" and with_cache(_New(), 1) == {"cache": 1}
    assert cache_keyword(_Old()) == "past_key_values" and positions_cache_kwargs(_Old()) == {"past_key_values": None}
    with pytest.raises(TypeError, match="neither"):
        cache_keyword(_Neither())


def test_output_cache_reads_either_name():
    class Out:
        pass

    a, b = Out(), Out()
    a.cache, b.past_key_values = "new", "old"
    assert output_cache(a) == "new" and output_cache(b) == "old" and output_cache(Out()) is None


def test_a_suffix_pass_with_the_cache_equals_the_whole_pass(tmp_path):
    """On the installed transformers and the real Qwen2.5-VL class (text rows): prompt with a cache, then the rest
    through ``with_cache``, gives the whole sequence's last hidden states; the keyword is the one the model takes, so
    a LoRA-wrapped model (``forward(*args, **kwargs)``) resolves it through its base model too."""
    from transformers import DynamicCache

    from mmrlvr.models import apply_lora, build_tiny, load_policy

    model, _ = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m", seed=0))
    backbone = model.model
    ids = torch.randint(10, 200, (2, 12))
    with torch.no_grad():
        whole = backbone(input_ids=ids, use_cache=False).last_hidden_state
        cache = DynamicCache()
        head = backbone(input_ids=ids[:, :7], use_cache=True, **with_cache(backbone, cache))
        tail = backbone(input_ids=ids[:, 7:], use_cache=True, **with_cache(backbone, output_cache(head)))
    torch.testing.assert_close(tail.last_hidden_state, whole[:, 7:], atol=1e-5, rtol=1e-5)
    assert cache_keyword(apply_lora(model, r=4, alpha=8, progress=False)) == cache_keyword(model)
