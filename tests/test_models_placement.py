"""mmrlvr.models.placement on the CPU: what can be checked without a second device (the GPU side is
tests/test_gpu.py): the structure of model inputs survives the move, objects that are not tensors pass through
untouched, and a move to the device the tensors are on is free (the same tensor objects, so CPU runs are
bit-identical to before)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrlvr.models.placement import model_device, to_model


@dataclass
class Features:  # stands for the precomputed image features (made on the model's device already)
    pooled: torch.Tensor


def test_to_model_keeps_structure_and_objects_and_does_not_copy_on_the_same_device():
    model = torch.nn.Linear(3, 2)
    feats = [Features(torch.ones(2))]
    ids = torch.arange(6).view(2, 3)
    inputs = {"input_ids": ids, "image_grid_thw": torch.tensor([[1, 2, 2]]), "mm_encoder_outputs": {"image": feats},
              "flag": True, "sizes": (torch.zeros(1), 3)}
    moved = to_model(inputs, model)
    assert type(moved) is dict and list(moved) == list(inputs)
    assert moved["input_ids"] is ids  # no copy where the tensor is on the model's device already
    assert moved["mm_encoder_outputs"]["image"][0] is feats[0]
    assert moved["flag"] is True and moved["sizes"][1] == 3 and isinstance(moved["sizes"], tuple)


def test_model_device_is_the_first_parameters_or_the_cpu():
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters


def test_token_logprobs_returns_on_the_response_ids_device():
    """The batch's device decides where per-token results land (here both are the CPU: the call path runs)."""
    from mmrlvr.models.tiny import MODEL_CLASSES, build_tokenizer, make_config
    from mmrlvr.train.forward import token_logprobs

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = MODEL_CLASSES["qwen2_5_vl"](make_config("qwen2_5_vl", tok)).eval()
    ids = torch.randint(20, 200, (2, 9))
    resp = ids[:, -4:]
    logp, ent = token_logprobs(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, resp,
                               with_entropy=True)
    assert logp.shape == ent.shape == (2, 4) and logp.device == resp.device and torch.isfinite(logp).all()
