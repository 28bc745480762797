"""Where a step's tensors live.

The step's batch (``RolloutBatch``, rewards, advantages, token weights, signals) lives on the CPU, which is
what every rollout engine returns and what the reward and credit code indexes with Python. Each model pass
takes its inputs to the model's device (``to_model``), and functions that return per-token results ([N, L])
hand them back on the device of the batch tensors they were given, so the loss and its statistics are
computed beside the batch while the gradient flows back through the copy to the model's device. Only
[N, L]-sized tensors cross (log-probs, entropies, signals); vocabulary-sized ones never leave the model's
device. On a CPU-only run every move is a no-op.

``send_to_device`` is accelerate's: it walks dicts, lists, tuples and named tuples and leaves other objects
(precomputed image features, which are made on the model's device already) as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import send_to_device


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def to_model(inputs: Any, model: torch.nn.Module) -> Any:
    """Model inputs (a tensor, or dicts / lists / tuples of them) with every tensor on ``model``'s device
    (a no-op where they are there already)."""
    return send_to_device(inputs, model_device(model))
