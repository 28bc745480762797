"""``mmrlvr analyze taskvec BASE SFT RL``: the SFT and the RL update as task vectors (DoTS); optionally merge them.

Paper: C. Yuan, C. Xiao, Y. Rong, H. Cheng, L.-K. Huang, "Decouple before Integration: Test-time Synthesis of
SFT and RLVR Task Vectors" (DoTS), arXiv 2605.00610. It compares an SFT and an RLVR checkpoint of one base model as
task vectors — a ~30× magnitude disparity, ~45 % sign interference, different modules updated — and merges them
back onto the base with sparsified, norm-preserving rescaled vectors and searched coefficients.

Official code: https://github.com/chaohaoyuan/DoTS at commit eb09ec701130ede07fe49b37438870ccd79062bf (its only
commit, 2026-05-02): ``src/dots/task_vector.py`` (``TaskVector``: the vector, ``keep_top_k_abs``,
``rescale_to_norm``; ``build_task_vector``), ``src/dots/search.py`` and ``src/dots/merge_eval.py`` (the merge).
What it does, and so what we do by default:

- Task vectors: each fine-tuned checkpoint against the base, ``τ = W_finetuned − W_0`` (float32); the SFT and the
  RLVR checkpoint are trained independently from the same base. Ours: ``τ_SFT = W_SFT − W_0`` and
  ``τ_RL = W_RL − W_0`` (``--rl-vector base``, the default). ``--rl-vector sft`` takes ``τ_RL = W_RL − W_SFT``
  instead: the RL stage's own update when RL continued from SFT (mmrlvr's warm start → RL runs; then W_RL − W_0
  contains τ_SFT, and a merge adds SFT's update twice). When we can tell that RL continued from SFT (a later
  checkpoint of the same run as SFT, or an RL run whose ``model.path`` is the SFT folder) and ``base`` is used,
  the command says so on stderr and in results.md / results.json (``note``); it does not switch by itself.
- Sparsification, per tensor: ``k = int(keep · numel)`` (rounded down); every element whose |τ| is at least the
  k-th largest |τ| of its tensor is kept (ties at that threshold all survive), the rest set to 0; a tensor with
  k < 1 becomes all zeros; keep = 1 keeps everything. ``--keep`` defaults to 0.3, the README's and
  ``build_task_vector``'s default (its fallback when a config sets no ``top_ratio`` reads the environment
  variable ``DOTS_SPARSITY_RATIO`` with default "0.3" through ``int()``, which cannot parse "0.3"; we take the
  documented 0.3).
- Rescale (``rescale_to_norm``): the sparsified vector s(τ) is multiplied by one factor ‖τ‖₂ / ‖s(τ)‖₂, both
  L2 norms of the whole vector (all its tensors together), per task vector, before the λ-weighted sum
  (``--rescale global``, the default; factor 1 when s(τ) = 0). ``--rescale tensor`` rescales each tensor to its
  own norm (what we did before); ``--rescale none`` leaves s(τ) as sparsified. In the official code this rescale
  is opt-in per model (a config's ``rescale_to_original_norm``; unset, so off, in the configs it ships), while
  the paper's method names norm-preserving rescaling as one of its parts: our default follows the paper, with the
  code's formula; ``--rescale none`` is what the shipped configs run.
- Merge: ``W = W_0 + λ_SFT·ŝ(τ_SFT) + λ_RL·ŝ(τ_RL)``.

Where we still deviate, and why:

- Coefficients. The official code searches (λ_SFT, λ_RL) in [0.5, 2]² with Optuna's multi-objective search (100
  trials) on a small unlabelled query pool chosen by difficulty, maximising answer consistency over 7 samples and
  minimising perplexity, and writes the Pareto front; its merge step takes the chosen pair as arguments. We score a
  small grid (``--lambda-sft``, ``--lambda-rl``) on labelled held-out prompts with the eval command's functions
  (greedy accuracy, avg@k, pass@k) and take the best by avg@k (greedy accuracy when k = 0; ties: greedy accuracy,
  then the grid point closest to (1, 1)): an mmrlvr run has verifiable held-out data, a grid is reproducible and
  needs no Optuna, and each point costs one eval on a CPU-sized budget.
- The analysis numbers have no code in the official repository; their definitions below are ours. They are
  computed on the two dense vectors ``--rl-vector`` chooses (results.json ``vectors`` names them); under
  ``--merge`` the sign conflict and overlap of the two sparsified vectors (the paper reports that sparsification
  lowers sign interference) are reported as well.
- Inputs: the official code takes the keys both checkpoints hold (skipping integer tensors and shape mismatches);
  we refuse checkpoints of different models, and read weights through the eval/export loader (a LoRA checkpoint
  merged into its base first; a LoRA checkpoint against a full fine-tuning one is refused).

The numbers (per parameter tensor, overall, per module family; τ_RL as ``--rl-vector`` says):

- magnitude ratio ``‖τ_RL‖ / ‖τ_SFT‖`` (Frobenius), per tensor and overall (norms over all tensors together);
  null where τ_SFT = 0;
- sign-conflict rate: among the elements where both vectors are non-zero, the share whose signs differ; the
  ``overlap`` (share of all elements where both are non-zero) is reported beside it, so conflicts over all
  elements are ``conflict × overlap``. Overall: pooled over the elements of all tensors. Also the cosine
  ⟨τ_SFT, τ_RL⟩ / (‖τ_SFT‖‖τ_RL‖);
- per-module share of each vector's energy: Σ ‖τ‖² over a module family / Σ ‖τ‖² over all tensors, with the
  families ``attn.q``, ``attn.k``, ``attn.v``, ``attn.o`` (weights and biases of q/k/v/o_proj of the language
  model; a fused ``qkv`` is ``attn.qkv``), ``mlp``, ``embeddings`` (``embed_tokens`` and ``lm_head``), ``vision``
  (everything under the vision tower, its attention and MLP included) and ``other`` (norms, ...).

``--merge`` scores every grid point on the first ``--eval-limit`` prompts of the RL run's eval data (or
``--eval-data``), scores SFT and RL themselves on the same prompts for reference, and writes the best merge as a
checkpoint-shaped model folder ``merged-best/`` (``mmrlvr eval --model`` and ``mmrlvr export`` take it).

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
import sys
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
RL_VECTORS = ("base", "sft")        # τ_RL against W_0 (the paper's) or against W_SFT
RESCALES = ("global", "tensor", "none")
DEFAULT_KEEP = 0.3                   # the official code's and README's top ratio
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


def task_vectors(w0: dict[str, "torch.Tensor"], w_sft: dict[str, "torch.Tensor"], w_rl: dict[str, "torch.Tensor"],
                 rl_vector: str = "base") -> tuple[dict[str, "torch.Tensor"], dict[str, "torch.Tensor"]]:
    """(τ_SFT = W_SFT − W_0, τ_RL = W_RL − W_0) per name (``rl_vector="base"``, the paper's), or
    τ_RL = W_RL − W_SFT (``rl_vector="sft"``); shapes as the weights."""
    if rl_vector not in RL_VECTORS:
        raise UserError(f"--rl-vector {rl_vector!r}: one of {', '.join(RL_VECTORS)}")
    ref = w0 if rl_vector == "base" else w_sft
    return ({n: w_sft[n] - w0[n] for n in w0}, {n: w_rl[n] - ref[n] for n in w0})


def vector_names(rl_vector: str) -> dict[str, str]:
    """What τ_SFT and τ_RL are, in words (results.json ``vectors``)."""
    return {"rl_vector": rl_vector, "tau_sft": "W_SFT − W_BASE",
            "tau_rl": "W_RL − W_BASE" if rl_vector == "base" else "W_RL − W_SFT"}


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


def _check_keep(keep: float) -> None:
    if not 0 < keep <= 1:
        raise UserError(f"--keep {keep}: must be in (0, 1]")


def keep_top(tau: "torch.Tensor", keep: float) -> "torch.Tensor":
    """τ sparsified as the official DoTS code does, per tensor: k = int(keep · numel) (rounded down); the elements
    with |τ| ≥ the k-th largest |τ| are kept (ties at the threshold all kept), the rest set to 0; all zeros when
    k < 1; unchanged (a copy) when keep = 1. Same shape."""
    import torch

    _check_keep(keep)
    n = tau.numel()
    if keep >= 1 or n == 0:
        return tau.clone()
    k = int(n * keep)
    if k < 1:
        return torch.zeros_like(tau)
    mag = tau.abs()
    threshold = torch.kthvalue(mag.reshape(-1), n - k + 1).values  # the k-th largest |τ|
    return torch.where(mag >= threshold, tau, torch.zeros_like(tau))


def vector_norm(vec: dict[str, "torch.Tensor"]) -> float:
    """The L2 norm of a whole task vector: sqrt of Σ over its tensors of Σ τ²."""
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in vec.values()))


def rescale_to_norm(sparse: "torch.Tensor", reference: "torch.Tensor") -> "torch.Tensor":
    """``sparse`` scaled to ‖reference‖ (Frobenius); unchanged when it is all zeros."""
    n = float(sparse.norm())
    return sparse * (float(reference.norm()) / n) if n > 0 else sparse.clone()


def sparsify_vector(tau: dict[str, "torch.Tensor"], keep: float, rescale: str = "global"
                    ) -> tuple[dict[str, "torch.Tensor"], float | None]:
    """(ŝ(τ) per name, the global factor): each tensor through ``keep_top``, then rescaled — ``global``: the whole
    vector times ‖τ‖₂ / ‖s(τ)‖₂ (norms over all its tensors; 1 when s(τ) = 0), the official code's
    ``rescale_to_norm``; ``tensor``: each tensor to its own norm; ``none``: not at all. The factor is None unless
    ``global``."""
    if rescale not in RESCALES:
        raise UserError(f"--rescale {rescale!r}: one of {', '.join(RESCALES)}")
    kept = {n: keep_top(t, keep) for n, t in tau.items()}
    if rescale == "tensor":
        return {n: rescale_to_norm(kept[n], tau[n]) for n in kept}, None
    if rescale == "none":
        return kept, None
    current = vector_norm(kept)
    factor = vector_norm(tau) / current if current > 0 else 1.0
    return {n: s * factor for n, s in kept.items()}, factor


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


def _step(folder: Path) -> int | None:
    import json

    try:
        return int(json.loads((folder / "state.json").read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _start_model(run: Path) -> str | None:
    """``model.path`` of a run's config.yaml (None when unreadable)."""
    import yaml

    try:
        path = (yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}).get("model", {}).get("path")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return str(path) if path else None


def continued_from_sft(sft_spec: str, sft_folder: Path, rl_folder: Path) -> str | None:
    """Why RL looks trained from SFT rather than from BASE (then W_RL − W_0 contains τ_SFT), or None when we
    cannot tell: SFT and RL are checkpoints of one run with RL the later one, or RL's run starts from
    ``model.path`` = the SFT folder."""
    sft_run, rl_run = run_dir_of(sft_folder), run_dir_of(rl_folder)
    if sft_run is not None and rl_run is not None and sft_run.resolve() == rl_run.resolve():
        a, b = _step(sft_folder), _step(rl_folder)
        if a is not None and b is not None and a < b:
            return f"SFT (step {a}) and RL (step {b}) are checkpoints of one run ({rl_run})"
    if rl_run is not None:
        start = _start_model(rl_run)
        if start is not None and Path(start).resolve() in {Path(sft_spec).resolve(), sft_folder.resolve()}:
            return f"RL's run ({rl_run}) starts from model.path {start}, the SFT model"
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
    p.epilog = ("Defaults follow DoTS (arXiv 2605.00610) and its official code (github.com/chaohaoyuan/DoTS @ "
                "eb09ec7): both task vectors against BASE, top 30 % per tensor, one norm-preserving factor per "
                "vector. The coefficients are picked on a grid by held-out accuracy, not by the paper's "
                "consistency/perplexity search (docs/analysis.md).")
    p.add_argument("base", metavar="BASE", help="the base model: model folder, checkpoint or run directory")
    p.add_argument("sft", metavar="SFT", help="the SFT model (fine-tuned from BASE)")
    p.add_argument("rl", metavar="RL", help="the RL model (the paper: trained from BASE; if it continued from SFT, "
                                            "see --rl-vector); its run folder gets the output")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write DIR/analysis/taskvec/ (needed when RL is not a run; default: RL's run folder)")
    p.add_argument("--top", type=int, default=12, metavar="N", help="tensors in the table (largest τ_RL; default 12)")
    p.add_argument("--rl-vector", choices=RL_VECTORS, default="base",
                   help="τ_RL against BASE: W_RL − W_BASE (default; the paper's and its official code's, for an RL "
                        "model trained from BASE independently of SFT) or against SFT: W_RL − W_SFT (the RL stage's "
                        "own update when RL continued from SFT, as after an mmrlvr warm start). Every number of the "
                        "report uses the vectors chosen here")
    p.add_argument("--merge", action="store_true",
                   help="merge sparsified, rescaled task vectors over a (λ_SFT, λ_RL) grid; write the best")
    p.add_argument("--keep", "--top-p", dest="keep", type=float, default=DEFAULT_KEEP, metavar="P",
                   help="with --merge: fraction of each tensor's elements kept, by |τ| (int(P·numel), ties at the "
                        "threshold kept; default 0.3, the official code's)")
    p.add_argument("--rescale", choices=RESCALES, default="global",
                   help="with --merge: after sparsifying, scale each vector back to its L2 norm over all tensors "
                        "(global, default: the paper's norm-preserving rescale, the official code's formula), each "
                        "tensor to its own norm (tensor), or not (none: the official shipped configs)")
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
        _check_keep(args.keep)
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
    tau_sft, tau_rl = task_vectors(w0, w_sft, w_rl, args.rl_vector)
    del w_sft
    result = compare(tau_sft, tau_rl)
    numbers: dict[str, Any] = {"inputs": {r: {"spec": roles[r], "folder": str(resolved[r][0]), "kind": resolved[r][1]}
                                          for r in roles}, "vectors": vector_names(args.rl_vector), **result}
    if args.rl_vector == "base":
        why = continued_from_sft(args.sft, resolved["SFT"][0], resolved["RL"][0])
        if why:
            numbers["note"] = (f"{why}: RL looks trained from SFT, so τ_RL = W_RL − W_BASE contains τ_SFT; "
                               "--rl-vector sft takes the RL stage's own update W_RL − W_SFT")
            print(f"note: {numbers['note']}", file=sys.stderr)
    merge_rows: list[dict[str, Any]] = []
    if args.merge:
        assert heldout is not None
        merge_rows, best, folder, sparse = _merge(args, w0, w_rl, tau_sft, tau_rl, resolved, heldout, lam_sft, lam_rl,
                                          out_root)
        numbers["merge"] = {"keep": args.keep, "rescale": args.rescale, **sparse, "lambda_sft": lam_sft,
                            "lambda_rl": lam_rl, "eval": heldout.settings(), "selection": _selection_key(heldout),
                            "grid": merge_rows, "best": best, "folder": str(folder)}
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
    """Score every grid point (and SFT, RL themselves); write the best merge. Returns (rows, best, folder,
    {rescale factors, sign conflict and overlap of the sparsified vectors})."""
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

    # all-zero tensors (frozen ones) add nothing to a norm and sparsify to zeros: left out
    s_sft, f_sft = sparsify_vector({n: t for n, t in tau_sft.items() if bool(t.any())}, args.keep, args.rescale)
    s_rl, f_rl = sparsify_vector({n: t for n, t in tau_rl.items() if bool(t.any())}, args.keep, args.rescale)
    conf = both = 0
    for n in s_sft.keys() & s_rl.keys():
        c, b = sign_conflicts(s_sft[n], s_rl[n])
        conf, both = conf + c, both + b
    numel = sum(w.numel() for w in w0.values())
    sparse = {"rescale_factor": {"sft": f_sft, "rl": f_rl},
              "sparse": {"sign_conflict": ratio(conf, both), "overlap": both / numel if numel else 0.0}}
    key = _selection_key(heldout)
    # RL itself as (λ_SFT, λ_RL) of the dense vectors: W_0 + τ_RL (base) or W_0 + τ_SFT + τ_RL (sft)
    rows: list[dict[str, Any]] = [
        {"model": "SFT", "lambda_sft": 1.0, "lambda_rl": 0.0, **score({n: w0[n] + tau_sft[n] for n in w0})},
        {"model": "RL", "lambda_sft": 0.0 if args.rl_vector == "base" else 1.0, "lambda_rl": 1.0, **score(w_rl)}]
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
                           "rl_vector": args.rl_vector, "keep": args.keep, "rescale": args.rescale,
                           "lambda_sft": best["lambda_sft"], "lambda_rl": best["lambda_rl"]}})
    return rows, best, folder, sparse


def _merge_line(m: dict) -> str:
    """How ŝ was made, in words (results.md)."""
    f = m["rescale_factor"]
    how = {"global": f"then each vector times one factor back to its L2 norm over all tensors (×{f['sft']:.4g} for "
                     f"τ_SFT, ×{f['rl']:.4g} for τ_RL)" if m["rescale"] == "global" else "",
           "tensor": "then each tensor rescaled to its own norm", "none": "not rescaled"}[m["rescale"]]
    sp = m["sparse"]
    conflict = "n/a" if sp["sign_conflict"] is None else f"{sp['sign_conflict']:.4g}"
    return (f"ŝ = per tensor the elements with |τ| ≥ the int({m['keep']:g}·numel)-th largest, {how} "
            f"(`--keep {m['keep']:g} --rescale {m['rescale']}`). The two sparsified vectors: sign conflict "
            f"{conflict} of the elements both keep, overlap {sp['overlap']:.4g}.")


def _fmt(x: float | None) -> Any:
    return "n/a" if x is None else float(x)


def _markdown(numbers: dict, top: int, heldout) -> str:
    from mmrlvr.analysis.report import markdown_table

    o = numbers["overall"]
    ins = numbers["inputs"]
    v = numbers["vectors"]
    lines = ["# Task vectors: SFT vs RL (DoTS, arXiv 2605.00610)", "",
             f"τ_SFT = {v['tau_sft']}, τ_RL = {v['tau_rl']} (`--rl-vector {v['rl_vector']}`"
             + (", the paper's" if v["rl_vector"] == "base" else "") + "); every number below is of these two "
             "vectors. " + "; ".join(f"{r}: `{ins[r]['folder']}` ({ins[r]['kind']})" for r in ins) + ".", ""]
    if numbers.get("note"):
        lines += [f"**Note:** {numbers['note']}.", ""]
    lines += [markdown_table(["overall", "value"], [
                  ["‖τ_RL‖ / ‖τ_SFT‖", _fmt(o["magnitude_ratio"])],
                  ["‖τ_SFT‖", o["norm_sft"]], ["‖τ_RL‖", o["norm_rl"]],
                  ["sign conflict (of elements both move)", _fmt(o["sign_conflict"])],
                  ["overlap (elements both move / all)", o["overlap"]],
                  ["cosine(τ_SFT, τ_RL)", _fmt(o["cosine"])]]), "",
              "## Per module family", "",
              f"Share = the family's Σ‖τ‖² over the whole vector's (each column adds up to 1); τ_RL = {v['tau_rl']}.",
              "",
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
                  _merge_line(m) + " Held-out: first "
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
