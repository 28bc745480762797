"""What runs inside vLLM's worker processes: the weight-sync methods ``VLLMEngine`` calls by name.

vLLM's V1 engine runs its model in another process and sends ``LLM.collective_rpc`` calls there with msgpack,
which carries neither closures nor tensors. So the trainer writes its weights to a safetensors file (under
``/dev/shm`` where it exists: memory, not disk) and calls a method of this class by name with the file's path;
vLLM mixes the class into its worker (``LLM(worker_extension_cls="mmrlvr.rollout.vllm_worker.WeightSync")``).

This module imports nothing from mmrlvr and nothing heavy at import time: the worker imports it by its qualified
name before the model exists.
"""

from __future__ import annotations

from typing import Any


class WeightSync:
    """Mixed into vLLM's worker: ``self.model_runner.model`` is the worker's model."""

    def mmrlvr_load_weights(self, path: str) -> dict[str, Any]:
        """Load the weights in the safetensors file at ``path`` (trainer names, e.g. ``model.visual.blocks.0...``)
        with the model's own ``load_weights`` (which maps them to vLLM's fused layout).

        Returns what the check on the trainer's side needs: ``loaded`` (how many of vLLM's parameters the file
        updated), ``missing`` (vLLM's parameters it did not touch: a weight the trainer did not send stays stale),
        ``sent`` (tensors in the file)."""
        from safetensors.torch import load_file

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        # vLLM's own names for what a full sync must reach (a LoRA-wrapped layer's base weight under its plain name)
        expected = {name.replace(".base_layer.", ".") for name, _ in model.named_parameters()}
        tensors = load_file(path)
        captured: dict[str, Any] = {}
        original = model.load_weights

        def load_and_record(weights: Any, *args: Any, **kwargs: Any) -> Any:
            captured["loaded"] = original(weights, *args, **kwargs)
            return captured["loaded"]

        model.load_weights = load_and_record  # reload_weights calls it; the instance attribute is removed below
        try:
            # vLLM's in-place reload: loads checkpoint-format weights and redoes the layers' post-load processing
            # (on CPU, linear weights are repacked for its kernels; a plain load_weights after start-up fails)
            self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        finally:
            del model.load_weights
        loaded = set(captured.get("loaded") or ())
        return {"loaded": len(expected & loaded), "missing": sorted(expected - loaded), "sent": len(tensors)}

    def mmrlvr_weight_sums(self, prefixes: list[str]) -> dict[str, float]:
        """Sum of every parameter whose name starts with one of ``prefixes`` (float64): a cheap fingerprint a test
        compares before and after a sync."""
        import torch

        out: dict[str, float] = {}
        for name, p in self.model_runner.get_model().named_parameters():  # type: ignore[attr-defined]
            if any(name.startswith(x) for x in prefixes):
                out[name] = float(p.detach().to(torch.float64).sum())
        return out
