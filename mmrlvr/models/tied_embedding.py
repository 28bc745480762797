"""Tied input/output embeddings: keep the embedding's backward from allocating a second [V, H] gradient.

Why: in a model whose LM head *is* its input embedding (``tie_word_embeddings``: Qwen2.5-VL-3B, Qwen2-VL-2B,
Qwen3-VL-2B/4B) a full fine-tuning backward computes two gradients for the one weight: the head's (dense,
[V, H]) and the embedding lookup's, which ``nn.Embedding`` also builds dense, [V, H] of zeros with the
looked-up rows added, before autograd sums the two. At V = 151,936 and H = 2,048 that second tensor is
1.16 GiB of float32 that exists only to be added (measured at V = 60,000, H = 1,024 in
tests/test_models_tied_embedding.py: the backward's peak falls by the tensor's 234 MiB; at the 3B stand-in
it was measured together with the blocked head gradient of ``mmrlvr.algos.logits``, not alone). With ``sparse=True`` the lookup's gradient is a sparse tensor of the
rows actually used, which autograd adds into the head's dense gradient: the weight's ``.grad`` is the same
dense sum (checked to float tolerance; the summation order differs), fused AdamW and the gradient-norm
clip see what they saw before, and the transient is gone. The fused LM head (``mmrlvr.algos.logits``) writes
its dense share into ``.grad`` itself (``write_grad_directly``): returned to autograd, the two shares were
summed into a new [V, H] tensor, which brought the transient back.

Only for a trainable *tied* weight: an untied embedding's gradient would then stay sparse, which fused
AdamW does not take (and an untied model has no second tensor to avoid). Only in one process: DDP marks a
module with ``sparse=True`` as producing sparse gradients and reduces it as such, which a dense sum is not.
"""

from __future__ import annotations

import torch


def tied_trainable_embedding(model: torch.nn.Module) -> torch.nn.Embedding | None:
    """The input embedding when it is a trainable ``nn.Embedding`` sharing its weight with the LM head."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return None
    emb, head = get_in(), get_out()
    if not isinstance(emb, torch.nn.Embedding) or head is None or getattr(head, "weight", None) is not emb.weight:
        return None
    return emb if emb.weight.requires_grad else None


def sparse_tied_embedding_grad(model: torch.nn.Module) -> bool:
    """Switch a trainable tied embedding's lookup to a sparse gradient (see the module docstring).
    Returns True when it did; a no-op (False) for untied, frozen or non-``nn.Embedding`` embeddings."""
    emb = tied_trainable_embedding(model)
    if emb is None:
        return False
    from mmrlvr.algos.logits import write_grad_directly

    emb.sparse = True
    write_grad_directly(emb.weight)  # the fused head's dense share goes into .grad, the sparse one adds in place
    return True
