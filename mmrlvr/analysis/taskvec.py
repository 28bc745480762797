"""``mmrlvr analyze taskvec BASE SFT RL``: what RL added on top of SFT, as task vectors; optionally merge them.

The paper: DoTS (arXiv 2605.00610) compares the SFT and the RL stage of a model as task vectors — how large the
RL update is next to the SFT one, how often the two pull single weights in opposite directions, where each
puts its weight — and merges them back onto the base with sparsified, rescaled vectors and tuned coefficients.

Task vectors (per parameter tensor; weights through the eval/export loader, a LoRA checkpoint merged):
``τ_SFT = W_SFT − W_0`` and ``τ_RL = W_RL − W_SFT`` (RL continues from SFT).

- magnitude ratio ``‖τ_RL‖ / ‖τ_SFT‖`` (Frobenius), per tensor and overall (norms over all tensors together);
  null where τ_SFT = 0;
- sign-conflict rate: among the elements where both vectors are non-zero, the share whose signs differ; the
  ``overlap`` (share of all elements where both are non-zero) is reported beside it, so the issue's literal
  reading (conflicts over all elements) is ``conflict × overlap``. Overall: pooled over the elements of all
  tensors. Also the cosine ⟨τ_SFT, τ_RL⟩ / (‖τ_SFT‖‖τ_RL‖);
- per-module share of each vector's energy: Σ ‖τ‖² over a module family / Σ ‖τ‖² over all tensors, with the
  families ``attn.q``, ``attn.k``, ``attn.v``, ``attn.o`` (weights and biases of q/k/v/o_proj of the language
  model; a fused ``qkv`` is ``attn.qkv``), ``mlp``, ``embeddings`` (``embed_tokens`` and ``lm_head``), ``vision``
  (everything under the vision tower, its attention and MLP included) and ``other`` (norms, ...).

``--merge`` (our reading of the paper's merge): each task vector is sparsified per tensor to its top-p
fraction by magnitude (``k = ceil(p · numel)`` elements kept, ties broken by ``torch.topk``), rescaled to its
original norm (ŝ(τ) = s(τ) · ‖τ‖ / ‖s(τ)‖, per tensor), and merged as ``W = W_0 + λ_SFT·ŝ(τ_SFT) +
λ_RL·ŝ(τ_RL)`` for every (λ_SFT, λ_RL) in a small grid. Each merge is scored on held-out prompts with the eval
command's functions (first ``--eval-limit`` prompts of the RL run's eval data, or ``--eval-data``; greedy
accuracy, avg@k, pass@k); the best by avg@k (greedy accuracy when k = 0; ties: greedy accuracy, then the
grid point closest to (1, 1)) is written as a checkpoint-shaped model folder ``merged-best/`` (``mmrlvr eval
--model`` and ``mmrlvr export`` take it), and SFT and RL themselves are scored on the same prompts for
reference. The paper is not explicit to us about p, the grid or the selection metric; ours are flags.

Inputs: each of BASE, SFT, RL is a model folder (config.json), a checkpoint folder (state.json) or a run
directory (its newest verified checkpoint). Checkpoints of different models are refused (names or shapes
differ); so is a LoRA checkpoint against a full fine-tuning one (their task vectors live in different
subspaces: a rank-r adapter update against a dense one), one line naming which is which — a plain BASE model
folder (kind ``model``) is always allowed, it is what both kinds start from. Output: RL's run folder
(``RL/analysis/taskvec/``) when RL is a run or a checkpoint in one, else ``--out DIR`` (``DIR/analysis/
taskvec/``). Memory: three full sets of float32 weights plus the two task vectors.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmrlvr.errors import UserError

if TYPE_CHECKING:
    import torch

NAME = "taskvec"
FAMILIES = ("attn.q", "attn.k", "attn.v", "attn.o", "attn.qkv", "mlp", "embeddings", "vision", "other")
_VISION = re.compile(r"(^|\.)(visual|vision_tower|vision_model|vision_encoder|image_encoder)\.")
_ATTN = {"q_proj": "attn.q", "k_proj": "attn.k", "v_proj": "attn.v", "o_proj": "attn.o", "out_proj": "attn.o",
         "qkv_proj": "attn.qkv", "qkv": "attn.qkv"}
_MLP = re.compile(r"(^|\.)(mlp|feed_forward|ffn)\.|(^|\.)(gate_proj|up_proj|down_proj|fc1|fc2|w1|w2|w3)\.")


# ------------------------------------------------------------------------------------------- tensor math
def module_family(name: str) -> str:
    """The module family of a parameter name (see the module docstring)."""
    if _VISION.search(name):
        return "vision"
    if "embed_tokens" in name or name.startswith("lm_head.") or ".lm_head." in name:
        return "embeddings"
    parts = name.split(".")
    for part in reversed(parts[:-1]):
        if part in _ATTN:
            return _ATTN[part]
    if _MLP.search(name):
        return "mlp"
    return "other"


def task_vectors(w0: dict[str, "torch.Tensor"], w_sft: dict[str, "torch.Tensor"], w_rl: dict[str, "torch.Tensor"]
                 ) -> tuple[dict[str, "torch.Tensor"], dict[str, "torch.Tensor"]]:
    """(τ_SFT = W_SFT − W_0, τ_RL = W_RL − W_SFT), per name, shapes as the weights."""
    return ({n: w_sft[n] - w0[n] for n in w0}, {n: w_rl[n] - w_sft[n] for n in w0})


def sign_conflicts(a: "torch.Tensor", b: "torch.Tensor") -> tuple[int, int]:
    """(elements where a and b are both non-zero with opposite signs, elements where both are non-zero)."""
    both = (a != 0) & (b != 0)
    return int((both & (a.sign() != b.sign())).sum()), int(both.sum())


def ratio(num: float, den: float) -> float | None:
    """num / den; None when den is 0 (undefined)."""
    return num / den if den > 0 else None


def module_shares(energy: dict[str, float]) -> dict[str, float]:
    """{family: share of Σ energy} from {parameter name: ‖τ‖²}; shares add up to 1 (all 0.0 when τ = 0)."""
    per: dict[str, float] = {}
    for name, e in energy.items():
        per[module_family(name)] = per.get(module_family(name), 0.0) + e
    total = sum(per.values())
    return {f: (per[f] / total if total > 0 else 0.0) for f in FAMILIES if f in per}


def top_p_sparsify(tau: "torch.Tensor", p: float) -> "torch.Tensor":
    """τ with all but its ``ceil(p · numel)`` largest-magnitude elements set to 0 (same shape)."""
    import torch

    if not 0 < p <= 1:
        raise UserError(f"--top-p {p}: must be in (0, 1]")
    flat = tau.reshape(-1)
    k = min(flat.numel(), math.ceil(p * flat.numel() - 1e-9))
    if k >= flat.numel():
        return tau.clone()
    keep = torch.topk(flat.abs(), k, sorted=False).indices
    out = torch.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(tau.shape)


def rescale_to_norm(sparse: "torch.Tensor", reference: "torch.Tensor") -> "torch.Tensor":
    """``sparse`` scaled to ‖reference‖ (Frobenius); unchanged when it is all zeros."""
    n = float(sparse.norm())
    return sparse * (float(reference.norm()) / n) if n > 0 else sparse.clone()


def sparsify_rescale(tau: "torch.Tensor", p: float) -> "torch.Tensor":
    """ŝ(τ): top-p sparsified, then rescaled to τ's norm."""
    return rescale_to_norm(top_p_sparsify(tau, p), tau)


def merged_weights(w0: dict[str, "torch.Tensor"], s_sft: dict[str, "torch.Tensor"], s_rl: dict[str, "torch.Tensor"],
                   lam_sft: float, lam_rl: float) -> dict[str, "torch.Tensor"]:
    """W_0 + λ_SFT·ŝ(τ_SFT) + λ_RL·ŝ(τ_RL) per name (names missing from s_* add nothing)."""
    out = {}
    for n, w in w0.items():
        m = w.clone()
        if n in s_sft:
            m += lam_sft * s_sft[n]
        if n in s_rl:
            m += lam_rl * s_rl[n]
        out[n] = m
    return out


def compare(tau_sft: dict[str, "torch.Tensor"], tau_rl: dict[str, "torch.Tensor"]) -> dict[str, Any]:
    """Per-tensor rows, overall numbers, per-family shares (and per-family ratio / conflicts) of two task
    vectors over the same names."""
    rows = []
    tot = {"sft2": 0.0, "rl2": 0.0, "dot": 0.0, "conf": 0, "both": 0, "numel": 0}
    fam: dict[str, dict[str, float]] = {}
    for name in tau_sft:
        a, b = tau_sft[name].to("cpu"), tau_rl[name].to("cpu")
        sft2, rl2 = float((a.double() ** 2).sum()), float((b.double() ** 2).sum())
        dot = float((a.double() * b.double()).sum())
        conf, both = sign_conflicts(a, b)
        f = module_family(name)
        rows.append({"name": name, "family": f, "numel": a.numel(), "norm_sft": math.sqrt(sft2),
                     "norm_rl": math.sqrt(rl2), "magnitude_ratio": ratio(math.sqrt(rl2), math.sqrt(sft2)),
                     "sign_conflict": ratio(conf, both), "overlap": both / a.numel() if a.numel() else 0.0,
                     "cosine": ratio(dot, math.sqrt(sft2 * rl2))})
        for key, v in (("sft2", sft2), ("rl2", rl2), ("dot", dot), ("conf", conf), ("both", both),
                       ("numel", a.numel())):
            tot[key] += v
            fam.setdefault(f, {k: 0.0 for k in tot})[key] += v
    shares_sft = module_shares({r["name"]: r["norm_sft"] ** 2 for r in rows})
    shares_rl = module_shares({r["name"]: r["norm_rl"] ** 2 for r in rows})
    families = {f: {"share_sft": shares_sft.get(f, 0.0), "share_rl": shares_rl.get(f, 0.0),
                    "magnitude_ratio": ratio(math.sqrt(d["rl2"]), math.sqrt(d["sft2"])),
                    "sign_conflict": ratio(d["conf"], d["both"]), "numel": int(d["numel"])}
                for f, d in ((f, fam[f]) for f in FAMILIES if f in fam)}
    overall = {"magnitude_ratio": ratio(math.sqrt(tot["rl2"]), math.sqrt(tot["sft2"])),
               "norm_sft": math.sqrt(tot["sft2"]), "norm_rl": math.sqrt(tot["rl2"]),
               "sign_conflict": ratio(tot["conf"], tot["both"]),
               "overlap": tot["both"] / tot["numel"] if tot["numel"] else 0.0,
               "cosine": ratio(tot["dot"], math.sqrt(tot["sft2"] * tot["rl2"])), "numel": int(tot["numel"])}
    return {"overall": overall, "families": families, "tensors": rows}


# ------------------------------------------------------------------------------------------------ inputs
def resolve(spec: str, what: str) -> tuple[Path, str]:
    """(checkpoint or model folder, kind ``lora`` | ``full`` | ``model``) of a run dir / checkpoint / model
    folder, without loading weights (a run directory: its newest verified checkpoint)."""
    from mmrlvr.analysis.checkpoints import run_checkpoints
    from mmrlvr.train.checkpoint import STATE

    path = Path(spec)
    if not path.exists():
        raise UserError(f"{what} {spec}: no such run directory, checkpoint or model folder")
    if (path / "checkpoints").is_dir():
        path = run_checkpoints(path).folders[-1]
    if (path / STATE).is_file():
        return path, ("lora" if (path / "adapter_config.json").is_file() else "full")
    if (path / "config.json").is_file():
        return path, "model"
    raise UserError(f"{what} {spec}: not a run directory (checkpoints/), a checkpoint (state.json) or a model "
                    f"folder (config.json)")


def check_kinds(kinds: dict[str, tuple[str, str]]) -> None:
    """Refuse a LoRA checkpoint against a full fine-tuning one ({role: (spec, kind)}; model folders pass)."""
    lora = [(r, s) for r, (s, k) in kinds.items() if k == "lora"]
    full = [(r, s) for r, (s, k) in kinds.items() if k == "full"]
    if lora and full:
        raise UserError(f"{lora[0][0]} ({lora[0][1]}) is a LoRA run's checkpoint and {full[0][0]} ({full[0][1]}) "
                        "a full fine-tuning one: their task vectors are not comparable; export the LoRA one merged "
                        "(mmrlvr export --merge) and pass that model folder to compare them anyway")


def run_dir_of(path: Path) -> Path | None:
    """The run directory of a run dir or of a checkpoint inside one (config.yaml), else None."""
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        return path
    if (path / "state.json").is_file() and (path.parent.parent / "config.yaml").is_file():
        return path.parent.parent
    return None


def skeleton_of(folder: Path, kind: str) -> Path:
    """A ``save_pretrained`` folder with the architecture (a LoRA checkpoint: its base model)."""
    from mmrlvr.train.export import base_model_folder

    return Path(base_model_folder(folder)) if kind == "lora" else folder


def processor_of(folder: Path, kind: str) -> Path:
    from mmrlvr.train.checkpoint import read_state
    from mmrlvr.train.export import processor_source

    return processor_source(folder, read_state(folder)) if kind != "model" else folder


def _floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: give comma-separated numbers, e.g. 0.5,1,1.5") from None
    if not vals:
        raise UserError(f"{flag} {text!r}: give at least one number")
    return vals


# ---------------------------------------------------------------------------------------------- runner
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", metavar="BASE", help="the base model: model folder, checkpoint or run directory")
    p.add_argument("sft", metavar="SFT", help="the SFT model (fine-tuned from BASE)")
    p.add_argument("rl", metavar="RL", help="the RL model (trained from SFT); its run folder gets the output")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write DIR/analysis/taskvec/ (needed when RL is not a run; default: RL's run folder)")
    p.add_argument("--top", type=int, default=12, metavar="N", help="tensors in the table (largest τ_RL; default 12)")
    p.add_argument("--merge", action="store_true",
                   help="merge sparsified, rescaled task vectors over a (λ_SFT, λ_RL) grid; write the best")
    p.add_argument("--top-p", type=float, default=0.2, metavar="P",
                   help="with --merge: fraction of each task vector's elements kept per tensor (default 0.2)")
    p.add_argument("--lambda-sft", default="0.5,1.0", metavar="L,...", help="λ_SFT grid (default 0.5,1.0)")
    p.add_argument("--lambda-rl", default="0.5,1.0,1.5", metavar="L,...", help="λ_RL grid (default 0.5,1.0,1.5)")
    p.add_argument("--eval-limit", type=int, default=8, metavar="N", help="held-out prompts per merge (default 8)")
    p.add_argument("--eval-k", type=int, default=2, metavar="K",
                   help="samples per prompt for avg@k / pass@k (default 2; 0 = greedy only)")
    p.add_argument("--eval-data", default=None, metavar="DATASET",
                   help="held-out data (default: the RL run's data.eval)")
    p.add_argument("--eval-max-new-tokens", type=int, default=None, metavar="N",
                   help="(default: the RL run's rollout.max_new_tokens, else 64)")


def run(args: argparse.Namespace) -> Path:
    from mmrlvr.analysis.checkpoints import check_same_model, weights_of
    from mmrlvr.analysis.report import write_report
    from mmrlvr.train.checkpoint import quiet_progress

    if args.top < 1:
        raise UserError(f"--top {args.top}: must be at least 1")
    roles = {"BASE": args.base, "SFT": args.sft, "RL": args.rl}
    resolved = {r: resolve(s, r) for r, s in roles.items()}
    check_kinds({r: (roles[r], k) for r, (_, k) in resolved.items()})
    rl_run = run_dir_of(Path(args.rl)) or run_dir_of(resolved["RL"][0])
    out_root = Path(args.out) if args.out else rl_run
    if out_root is None:
        raise UserError(f"RL {args.rl} is not a run directory (nor a checkpoint in one): pass --out DIR for the "
                        "results")
    heldout = None
    if args.merge:
        lam_sft, lam_rl = _floats(args.lambda_sft, "--lambda-sft"), _floats(args.lambda_rl, "--lambda-rl")
        if not 0 < args.top_p <= 1:
            raise UserError(f"--top-p {args.top_p}: must be in (0, 1]")
        if args.eval_limit < 1:
            raise UserError(f"--eval-limit {args.eval_limit}: --merge picks its coefficients on held-out prompts, "
                            "give at least 1")
        heldout = _held_out(args, rl_run)
    with quiet_progress():
        w0, _ = weights_of(resolved["BASE"][0])
        w_sft, _ = weights_of(resolved["SFT"][0])
        check_same_model(w0, w_sft, f"BASE {args.base}", f"SFT {args.sft}")
        w_rl, _ = weights_of(resolved["RL"][0])
        check_same_model(w_sft, w_rl, f"SFT {args.sft}", f"RL {args.rl}")
    tau_sft, tau_rl = task_vectors(w0, w_sft, w_rl)
    del w_sft
    result = compare(tau_sft, tau_rl)
    numbers: dict[str, Any] = {"inputs": {r: {"spec": roles[r], "folder": str(resolved[r][0]), "kind": resolved[r][1]}
                                          for r in roles}, **result}
    merge_rows: list[dict[str, Any]] = []
    if args.merge:
        assert heldout is not None
        merge_rows, best, folder = _merge(args, w0, w_rl, tau_sft, tau_rl, resolved, heldout, lam_sft, lam_rl,
                                          out_root)
        numbers["merge"] = {"top_p": args.top_p, "lambda_sft": lam_sft, "lambda_rl": lam_rl,
                            "eval": heldout.settings(), "selection": _selection_key(heldout), "grid": merge_rows,
                            "best": best, "folder": str(folder)}
    md = _markdown(numbers, args.top, heldout)
    plots = {"module_shares.png": lambda: _plot_shares(result),
             "tensors.png": lambda: _plot_tensors(result["tensors"])}
    if merge_rows:
        plots["merge_grid.png"] = lambda: _plot_grid(merge_rows, heldout)
    return write_report(out_root, NAME, numbers, md, plots)


def _held_out(args: argparse.Namespace, rl_run: Path | None):
    from mmrlvr.analysis.trajectory import held_out
    from mmrlvr.config import RunConfig, load_config

    cfg = load_config(rl_run / "config.yaml") if rl_run is not None else RunConfig()
    max_new = args.eval_max_new_tokens or (None if rl_run is not None else 64)
    return held_out(cfg, args.eval_data, args.eval_limit, args.eval_k, max_new_tokens=max_new,
                    what=f"RL {args.rl}" + ("" if rl_run is not None else " (not a run)"),
                    hint="--merge picks its coefficients on held-out prompts")


def _selection_key(heldout) -> str:
    return f"avg@{heldout.k}" if heldout.k > 0 else "greedy_accuracy"


def _merge(args, w0, w_rl, tau_sft, tau_rl, resolved, heldout, lam_sft, lam_rl, out_root: Path):
    """Score every grid point (and SFT, RL themselves); write the best merge. Returns (rows, best, folder)."""
    import torch

    from mmrlvr.analysis.trajectory import write_weights_checkpoint
    from mmrlvr.models import load_policy
    from mmrlvr.train.checkpoint import quiet_progress

    rl_folder, rl_kind = resolved["RL"]
    skeleton = skeleton_of(rl_folder, rl_kind)
    with quiet_progress():
        model, processor = load_policy(str(skeleton), dtype="float32")
    params = dict(model.named_parameters())

    def score(weights: dict[str, torch.Tensor]) -> dict[str, Any]:
        with torch.no_grad():
            for n, v in weights.items():
                params[n].copy_(v)
        return heldout.score(model, processor)

    s_sft = {n: sparsify_rescale(t, args.top_p) for n, t in tau_sft.items() if bool(t.any())}
    s_rl = {n: sparsify_rescale(t, args.top_p) for n, t in tau_rl.items() if bool(t.any())}
    key = _selection_key(heldout)
    rows: list[dict[str, Any]] = [
        {"model": "SFT", "lambda_sft": 1.0, "lambda_rl": 0.0, **score({n: w0[n] + tau_sft[n] for n in w0})},
        {"model": "RL", "lambda_sft": 1.0, "lambda_rl": 1.0, **score(w_rl)}]
    for ls in lam_sft:
        for lr in lam_rl:
            rows.append({"model": "merge", "lambda_sft": ls, "lambda_rl": lr,
                         **score(merged_weights(w0, s_sft, s_rl, ls, lr))})
    merges = [r for r in rows if r["model"] == "merge"]
    best = max(merges, key=lambda r: (r[key], r["greedy_accuracy"],
                                      -math.hypot(r["lambda_sft"] - 1, r["lambda_rl"] - 1)))
    del model, params
    folder = write_weights_checkpoint(
        merged_weights(w0, s_sft, s_rl, best["lambda_sft"], best["lambda_rl"]), skeleton,
        out_root / "analysis" / NAME / "merged-best", processor_from=processor_of(rl_folder, rl_kind), step=0,
        base_model=skeleton_of(*resolved["BASE"]),
        info={"analysis": {"name": "taskvec-merge", "base": args.base, "sft": args.sft, "rl": args.rl,
                           "top_p": args.top_p, "lambda_sft": best["lambda_sft"], "lambda_rl": best["lambda_rl"]}})
    return rows, best, folder


def _fmt(x: float | None) -> Any:
    return "n/a" if x is None else float(x)


def _markdown(numbers: dict, top: int, heldout) -> str:
    from mmrlvr.analysis.report import markdown_table

    o = numbers["overall"]
    ins = numbers["inputs"]
    lines = ["# Task vectors: SFT vs RL (DoTS, arXiv 2605.00610)", "",
             "τ_SFT = W_SFT − W_BASE, τ_RL = W_RL − W_SFT. " + "; ".join(
                 f"{r}: `{ins[r]['folder']}` ({ins[r]['kind']})" for r in ins) + ".", "",
             markdown_table(["overall", "value"], [
                 ["‖τ_RL‖ / ‖τ_SFT‖", _fmt(o["magnitude_ratio"])],
                 ["‖τ_SFT‖", o["norm_sft"]], ["‖τ_RL‖", o["norm_rl"]],
                 ["sign conflict (of elements both move)", _fmt(o["sign_conflict"])],
                 ["overlap (elements both move / all)", o["overlap"]],
                 ["cosine(τ_SFT, τ_RL)", _fmt(o["cosine"])]]), "",
             "## Per module family", "",
             "Share = the family's Σ‖τ‖² over the whole vector's (each column adds up to 1).", "",
             markdown_table(["family", "share of ‖τ_SFT‖²", "share of ‖τ_RL‖²", "‖τ_RL‖/‖τ_SFT‖", "sign conflict",
                             "params"],
                            [[f, d["share_sft"], d["share_rl"], _fmt(d["magnitude_ratio"]), _fmt(d["sign_conflict"]),
                              d["numel"]] for f, d in numbers["families"].items()]), ""]
    rows = sorted(numbers["tensors"], key=lambda r: -r["norm_rl"])[:top]
    lines += [f"## Top {len(rows)} tensors by ‖τ_RL‖", "",
              markdown_table(["tensor", "family", "‖τ_SFT‖", "‖τ_RL‖", "ratio", "sign conflict", "overlap", "cosine"],
                             [[r["name"], r["family"], r["norm_sft"], r["norm_rl"], _fmt(r["magnitude_ratio"]),
                               _fmt(r["sign_conflict"]), r["overlap"], _fmt(r["cosine"])] for r in rows])]
    m = numbers.get("merge")
    if m:
        s = m["eval"]
        lines += ["", "## Merge: W_0 + λ_SFT·ŝ(τ_SFT) + λ_RL·ŝ(τ_RL)", "",
                  f"ŝ = top-{m['top_p']:g} fraction per tensor, rescaled to the original norm. Held-out: first "
                  f"{s['n']} prompts of `{s['data']}`, k={s['k']}, temperature {s['temperature']}, max "
                  f"{s['max_new_tokens']} new tokens, seed {s['seed']}; picked by {m['selection']}. Best: "
                  f"λ_SFT={m['best']['lambda_sft']:g}, λ_RL={m['best']['lambda_rl']:g} → `{m['folder']}`.", "",
                  markdown_table(["model", "λ_SFT", "λ_RL", *heldout.accuracy_header()],
                                 [[r["model"], r["lambda_sft"], r["lambda_rl"], *heldout.accuracy_row(r)]
                                  for r in m["grid"]])]
    return "\n".join(lines)


def _plot_shares(result: dict):
    import matplotlib.pyplot as plt

    fams = list(result["families"])
    x = range(len(fams))
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(fams) + 2), 3.6), layout="constrained")
    ax.bar([i - 0.2 for i in x], [result["families"][f]["share_sft"] for f in fams], 0.4, label="τ_SFT")
    ax.bar([i + 0.2 for i in x], [result["families"][f]["share_rl"] for f in fams], 0.4, label="τ_RL")
    ax.set_xticks(list(x), fams)
    ax.set_ylabel("share of ‖τ‖²")
    ax.set_title("where each task vector puts its energy")
    ax.legend()
    return fig


def _plot_tensors(rows: list[dict]):
    import matplotlib.pyplot as plt

    moved = [r for r in rows if r["norm_sft"] > 0 or r["norm_rl"] > 0]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    fams = sorted({r["family"] for r in moved})
    for f in fams:
        pts = [r for r in moved if r["family"] == f]
        ax1.scatter([r["norm_sft"] for r in pts], [r["norm_rl"] for r in pts], s=12, label=f)
        both = [r for r in pts if (r["magnitude_ratio"] or 0) > 0 and r["sign_conflict"] is not None]
        ax2.scatter([r["magnitude_ratio"] for r in both], [r["sign_conflict"] for r in both], s=12, label=f)
    top = max([r["norm_sft"] for r in moved] + [r["norm_rl"] for r in moved] + [1e-12])
    ax1.plot([0, top], [0, top], ":", color="grey")
    ax1.set_xlabel("‖τ_SFT‖ per tensor")
    ax1.set_ylabel("‖τ_RL‖ per tensor")
    ax1.legend(fontsize=7)
    ax2.axhline(0.5, ls=":", color="grey")
    ax2.set_xlabel("‖τ_RL‖ / ‖τ_SFT‖")
    ax2.set_ylabel("sign conflict")
    if any((r["magnitude_ratio"] or 0) > 0 and r["sign_conflict"] is not None for r in moved):
        ax2.set_xscale("log")  # only with a positive ratio to show (a log axis of nothing fails to draw)
    ax2.set_title("per tensor (0.5 = independent signs)", fontsize=9)
    return fig


def _plot_grid(rows: list[dict], heldout):
    import matplotlib.pyplot as plt

    key = _selection_key(heldout)
    merges = [r for r in rows if r["model"] == "merge"]
    ls = sorted({r["lambda_sft"] for r in merges})
    lr = sorted({r["lambda_rl"] for r in merges})
    grid = [[next(r[key] for r in merges if r["lambda_sft"] == a and r["lambda_rl"] == b) for b in lr] for a in ls]
    fig, ax = plt.subplots(figsize=(1.2 * len(lr) + 2.5, 1.0 * len(ls) + 1.8), layout="constrained")
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower")
    ax.set_xticks(range(len(lr)), [f"{v:g}" for v in lr])
    ax.set_yticks(range(len(ls)), [f"{v:g}" for v in ls])
    ax.set_xlabel("λ_RL")
    ax.set_ylabel("λ_SFT")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=8)
    ref = {r["model"]: r[key] for r in rows if r["model"] != "merge"}
    ax.set_title(f"{key} of merges (SFT {ref.get('SFT', 0):.2f}, RL {ref.get('RL', 0):.2f})", fontsize=9)
    fig.colorbar(im, ax=ax)
    return fig
