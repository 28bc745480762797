"""Two optimizer steps of the tiny Qwen2.5-VL, plain (1 process) or FSDP2-sharded (under torchrun).

``python tests/scripts/fsdp2_step.py MODEL OUT full|lora``: every process takes its contiguous rows of one
fixed global batch; the loss is the global token mean (each rank's sum over the global count, times the
world size because FSDP2 averages gradients over ranks), clipped to norm 0.25 (the clip engages: the first
norms are 3.3 full, 0.49 LoRA), AdamW through ``mmrlvr.train.optim``. Between the steps, ``generate`` runs under
``gathered`` with a different number of new tokens per rank (a per-token collective would hang). Rank 0
writes ``OUT/params.pt`` (full tensors) and ``OUT/shards.json`` (global and local shape per parameter);
a 4th argument ``save`` also writes a checkpoint ``OUT/run/checkpoints/step-00000002`` (``save_distributed``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch


def main(model_dir: str, out: str, mode: str, save: str = "") -> None:
    import torch.distributed as dist

    from mmrlvr.models import load_policy
    from mmrlvr.train import distributed as D
    from mmrlvr.train.optim import build_optimizer, clip_grad_norm_and_check

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    model, _ = load_policy(model_dir, dtype="float32", device="cpu")
    if mode == "lora":
        from mmrlvr.models.lora import apply_lora

        model = apply_lora(model, r=4, alpha=8)
        with torch.no_grad():  # B = 0 at init: give it values so A's gradient is not zero either
            gen = torch.Generator().manual_seed(1)
            for n, p in model.named_parameters():
                if p.requires_grad and "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    if world > 1:
        D.shard_model(model)
    opt = build_optimizer(model.parameters(), SimpleNamespace(lr=1e-3, betas=[0.9, 0.999], weight_decay=0.01))
    gen = torch.Generator().manual_seed(123)
    ids = torch.randint(10, 500, (4, 16), generator=gen)
    per = ids.shape[0] // world
    mine = ids[rank * per:(rank + 1) * per]
    count = float(ids.shape[0] * (ids.shape[1] - 1))
    norms = []
    for step in range(2):
        logits = model(input_ids=mine).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), mine[:, 1:].reshape(-1),
                                                reduction="sum")
        (nll / count * world).backward()
        norms.append(clip_grad_norm_and_check(list(model.parameters()), 0.25))
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            with torch.no_grad(), D.gathered(model):
                n_new = 3 + 4 * rank
                res = model.generate(input_ids=ids[:1, :4], max_new_tokens=n_new, min_new_tokens=n_new,
                                     do_sample=False)
            assert res.shape[1] == 4 + n_new, res.shape
    if save:  # a checkpoint of the trained state (every rank writes its shards)
        from mmrlvr.train.checkpoint import save_distributed

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _s: 1.0)
        lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                "init": "default"} if mode == "lora" else None
        save_distributed(Path(out) / "run", 2, model, opt, sched, {"lora": lora}, keep=2)
    full, shards = {}, {}
    for n, p in model.named_parameters():
        if D.is_dtensor(p):
            shards[n] = {"shape": list(p.shape), "local": list(p.to_local().shape)}
            p = p.full_tensor()
        if model.get_parameter(n).requires_grad:
            full[n] = p.detach().clone()
    if rank == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        torch.save(full, Path(out) / "params.pt")
        (Path(out) / "shards.json").write_text(json.dumps({"world": world, "norms": norms, "shards": shards}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
