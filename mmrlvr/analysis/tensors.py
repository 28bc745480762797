"""``mmrlvr analyze tensors A B``: which attention projections carry the update ΔW = W_B − W_A (MAST, arXiv
2606.19222).

Per projection matrix W (d_out × d_in) of the language model — attention q/k/v/o ranked together, the MLP's
gate/up/down ranked separately in a second table — three scores of the update ΔW:

1. **off-principal energy** ‖(I − U_k U_kᵀ) ΔW‖²_F / ‖ΔW‖²_F, U_k the top-k left singular vectors of W_A: the
   share of the update that leaves the output directions the pre-update matrix already uses most (1 = entirely
   outside them, 0 = entirely inside; a projection that did not move scores 0). An update in a uniformly random
   direction scores 1 − k/d_out on average (reported as ``random_energy``): below it, the update prefers W_A's
   principal directions;
2. **‖ΔW‖_F**, the size of the update (also reported relative to ‖W_A‖_F, not ranked);
3. with ``--forget DATA``: **|⟨∇L_forget, ΔW⟩|** (Frobenius inner product), ∇L_forget the gradient at model A of
   the token-mean NLL of the forget set's reference answers — to first order the change of that loss the update
   of this one projection causes alone.

The ranking: each projection is ranked by each score (1 = largest; ties share the mean rank), the ranks are
summed, and the smallest rank sum ranks first. **Our reading:** the three scores and a rank-sum are the method;
how the scores are oriented and combined is not explicit in the paper as we read it: we rank every score
largest-first, weight them equally, and leave out the forget score when no forget set is given (two scores then).
The forget set is read as ``eval`` reads data (``load_split``, the test split, the run's data settings). Also
ours: the reference answer of a forget sample is its ``solution`` when the data has one, else its ground truth in
the run's answer format (``<answer>…</answer>`` for r1, ``\\boxed{…}`` for boxed) followed by the end-of-turn
token; at most ``--forget-limit`` samples, the loss is the mean over all their reference tokens at temperature 1.

The choice of k: ``--k`` when given, else ``max(1, floor(K_FRACTION · min(d_out, d_in)))`` with K_FRACTION = 1%
(``--k-fraction``). The principal subspace should be the few directions that dominate a trained matrix: 1% is
35 directions of a 7B model's 3584-wide q_proj and 5 of its 512-row k_proj, and the floor keeps one direction
(the top one) for the tiny test models (128 wide). Singular vectors: an exact SVD in float64 up to
``EXACT_SVD_MAX`` on the smaller side, else the eigenvectors of the smaller Gram matrix (W Wᵀ or Wᵀ W) in
float64, which gives the same top-k directions at a fraction of the cost for 7B MLP matrices.

Weights come from ``mmrlvr.analysis.checkpoints.weights_of`` (LoRA merged into its base); A and B may be run
directories (newest checkpoint), checkpoints or model folders. Output: B's run folder when B is a run or one of
its checkpoints, else ``--out``.
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

NAME = "tensors"
K_FRACTION = 0.01
EXACT_SVD_MAX = 2048  # smaller side up to this: full SVD; above: eigenvectors of the smaller Gram matrix
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
PROJECTION = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(ATTENTION + MLP) + r")\.weight$")
VISION_PARTS = ("visual.", "vision_tower.", "vision_model.")
DEFAULT_FORGET_LIMIT = 8
SCORES = ("off_principal_energy", "delta_norm", "forget_alignment")


# ------------------------------------------------------------------------------------------ pure math
def is_language_projection(name: str) -> bool:
    """A q/k/v/o or gate/up/down projection weight of the language model (not the vision tower's)."""
    return PROJECTION.search(name) is not None and not any(v in name for v in VISION_PARTS)


def default_k(shape: tuple[int, ...], fraction: float = K_FRACTION) -> int:
    """k of a [d_out, d_in] matrix: max(1, floor(fraction · min(d_out, d_in)))."""
    return max(1, int(math.floor(fraction * min(shape))))


def top_left_singular(w: "torch.Tensor", k: int, exact_max: int = EXACT_SVD_MAX) -> "torch.Tensor":
    """The top-k left singular vectors of w [d_out, d_in] as columns: [d_out, k] float64, orthonormal.

    Exact SVD when min(d_out, d_in) ≤ ``exact_max``; else eigenvectors of the smaller Gram matrix: W Wᵀ gives U
    directly, Wᵀ W gives V and U_k = W V_k / σ_k."""
    import torch

    w = w.double()
    k = min(k, min(w.shape))
    if min(w.shape) <= exact_max:
        u, _, _ = torch.linalg.svd(w, full_matrices=False)
        return u[:, :k]
    if w.shape[0] <= w.shape[1]:
        _, vecs = torch.linalg.eigh(w @ w.T)  # ascending eigenvalues
        return vecs[:, -k:].flip(-1)
    vals, vecs = torch.linalg.eigh(w.T @ w)
    v = vecs[:, -k:].flip(-1)
    sigma = vals[-k:].flip(-1).clamp_min(0).sqrt().clamp_min(1e-30)
    return (w @ v) / sigma


def off_principal_energy(u_k: "torch.Tensor", dw: "torch.Tensor") -> float:
    """‖(I − U_k U_kᵀ) ΔW‖²_F / ‖ΔW‖²_F for u_k [d_out, k] orthonormal and ΔW [d_out, d_in]; 0 when ΔW = 0."""
    dw = dw.double()
    total = float((dw ** 2).sum())
    if total == 0.0:
        return 0.0
    rest = dw - u_k @ (u_k.T @ dw)
    return float((rest ** 2).sum()) / total


def ranks_desc(values: list[float]) -> list[float]:
    """Rank of each value, 1 = largest; tied values share the mean of their ranks ([3, 1, 3] -> [1.5, 3, 1.5])."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rank_sum(rows: list[dict[str, Any]], scores: tuple[str, ...]) -> list[dict[str, Any]]:
    """Add ``rank_<score>`` per score, ``rank_sum`` and the final ``rank`` (1 = smallest rank sum; ties share the
    better rank) to each row; returns the rows sorted by rank. Scores that are None in every row are skipped."""
    used = [s for s in scores if any(r.get(s) is not None for r in rows)]
    for s in used:
        for r, rk in zip(rows, ranks_desc([r[s] if r.get(s) is not None else -math.inf for r in rows])):
            r[f"rank_{s}"] = rk
    for r in rows:
        r["rank_sum"] = sum(r[f"rank_{s}"] for s in used)
    sums = sorted(r["rank_sum"] for r in rows)
    for r in rows:
        r["rank"] = sums.index(r["rank_sum"]) + 1
    return sorted(rows, key=lambda r: (r["rank"], r["name"]))


def score_projections(wa: dict[str, "torch.Tensor"], wb: dict[str, "torch.Tensor"], *, k: int | None = None,
                      k_fraction: float = K_FRACTION, grads: dict[str, "torch.Tensor"] | None = None
                      ) -> dict[str, list[dict[str, Any]]]:
    """Scores and rank-sum of every language-model projection in both weight sets.

    wa, wb: {name: [d_out, d_in]}; grads: {name: ∇L_forget at A, same shape} or None.
    Returns {"attention": rows, "mlp": rows}, each ranked on its own (``rank_sum``)."""
    groups: dict[str, list[dict[str, Any]]] = {"attention": [], "mlp": []}
    for name in sorted(n for n in wa if is_language_projection(n)):
        m = PROJECTION.search(name)
        layer, module = int(m.group(1)), m.group(2)
        w, dw = wa[name], wb[name].float() - wa[name].float()
        kk = k if k is not None else default_k(tuple(w.shape), k_fraction)
        kk = min(kk, min(w.shape))
        norm_a = float(w.double().norm())
        row = {"name": name, "layer": layer, "module": module, "shape": list(w.shape), "k": kk,
               "off_principal_energy": off_principal_energy(top_left_singular(w, kk), dw),
               "random_energy": 1.0 - kk / w.shape[0],
               "delta_norm": float(dw.double().norm()),
               "relative_delta_norm": float(dw.double().norm()) / norm_a if norm_a > 0 else None,
               "forget_alignment": (abs(float((grads[name].double() * dw.double()).sum()))
                                    if grads is not None and name in grads else None)}
        groups["attention" if module in ATTENTION else "mlp"].append(row)
    return {g: rank_sum(rows, SCORES) for g, rows in groups.items() if rows}


# ------------------------------------------------------------------------------------------ forget gradient
def reference_response(sample: Any, fmt: str) -> str:
    """The text a forget sample's reference answer is scored as (see the module docstring)."""
    solution = (sample.meta or {}).get("solution")
    if solution:
        return str(solution)
    answer = "" if sample.answer is None else str(sample.answer)
    if fmt == "r1":
        return f"<answer>{answer}</answer>"
    if fmt == "boxed":
        return f"\\boxed{{{answer}}}"
    return answer


def forget_gradients(loaded: Any, samples: list, fmt: str, names: set[str], batch_size: int = 8
                     ) -> tuple[dict[str, "torch.Tensor"], float]:
    """(∇ of the token-mean NLL of the samples' reference answers w.r.t. each named weight at the loaded model,
    that loss). ``loaded``: a ``tokens.LoadedModel`` (a LoRA model is merged into its base first)."""
    import torch

    from mmrlvr.analysis.checkpoints import _plain_name
    from mmrlvr.analysis.tokens import teacher_forced_batch
    from mmrlvr.train.forward import token_logprobs

    model = loaded.model.merge_and_unload() if hasattr(loaded.model, "merge_and_unload") else loaded.model
    model.eval()
    params = {}
    for n, p in model.named_parameters():
        p.requires_grad_(_plain_name(n) in names)
        if _plain_name(n) in names:
            params[_plain_name(n)] = p
            p.grad = None
    tok = getattr(loaded.processor, "tokenizer", loaded.processor)
    from mmrlvr.rollout.hf import HFEngine

    eos = HFEngine(model, loaded.processor).eos_ids[0]
    responses = [tok(reference_response(s, fmt), add_special_tokens=False)["input_ids"] + [eos] for s in samples]
    total_tokens = sum(len(r) for r in responses)
    loss_sum = 0.0
    for i in range(0, len(samples), batch_size):
        batch, lengths = teacher_forced_batch(loaded.processor, model, samples[i:i + batch_size],
                                              responses[i:i + batch_size])
        logp, _ = token_logprobs(model, batch.model_inputs(), batch.response_ids)
        mask = torch.zeros_like(logp)
        for j, n in enumerate(lengths):
            mask[j, :n] = 1.0
        loss = -(logp * mask).sum() / total_tokens
        loss.backward()
        loss_sum += float(loss.detach())
    grads = {n: (p.grad.detach().float().cpu() if p.grad is not None else torch.zeros_like(p, device="cpu"))
             for n, p in params.items()}
    return grads, loss_sum


# ------------------------------------------------------------------------------------------ runner
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the earlier weights: run directory (newest checkpoint), checkpoint or "
                   "model folder")
    p.add_argument("b", metavar="B", help="the later weights (ΔW = W_B − W_A)")
    p.add_argument("--k", type=int, default=None, help="principal directions per matrix (default: --k-fraction of "
                   "the smaller dimension, at least 1)")
    p.add_argument("--k-fraction", type=float, default=K_FRACTION,
                   help=f"default k as a fraction of min(d_out, d_in) (default {K_FRACTION})")
    p.add_argument("--forget", default=None, metavar="DATA",
                   help="forget set (a dataset path or synth:TASK, read as eval reads data): adds |<grad L_forget, "
                        "dW>| at A to the ranking")
    p.add_argument("--forget-limit", type=int, default=DEFAULT_FORGET_LIMIT,
                   help=f"forget samples used (default {DEFAULT_FORGET_LIMIT})")
    p.add_argument("--out", default=None, metavar="DIR", help="where to write when B is not a run (files go to "
                   "DIR/analysis/tensors/); when given it wins over B's run")


def run(args: argparse.Namespace) -> Path:
    from mmrlvr.train.checkpoint import quiet_progress

    with quiet_progress():
        return _run(args)


def _run(args: argparse.Namespace) -> Path:
    from mmrlvr.analysis.checkpoints import check_same_model, weights_of
    from mmrlvr.analysis.report import write_report
    from mmrlvr.analysis.tokens import check_kinds, kind_and_step, run_of

    for spec in (args.a, args.b):
        if not Path(spec).exists():
            raise UserError(f"{spec}: no such run directory, checkpoint or model folder")
    out_root = Path(args.out) if args.out else run_of(args.b)
    if out_root is None:
        raise UserError(f"{args.b} is not a run directory nor one of its checkpoints; pass --out DIR for the results")
    if args.k is not None and args.k < 1:
        raise UserError(f"--k must be at least 1, got {args.k}")
    if not 0 < args.k_fraction <= 1:
        raise UserError(f"--k-fraction must be in (0, 1], got {args.k_fraction}")
    check_kinds(kind_and_step(args.a)[0], kind_and_step(args.b)[0], "A", "B")  # before any weights are read
    wa, kind_a = weights_of(args.a, is_language_projection)
    wb, kind_b = weights_of(args.b, is_language_projection)
    check_same_model(wa, wb, f"A ({args.a})", f"B ({args.b})")
    if not wa:
        raise UserError(f"{args.a}: no language-model q/k/v/o projection weights found (names like "
                        f"'model.layers.0.self_attn.q_proj.weight')")
    grads, forget = None, None
    if args.forget:
        grads, forget = _forget(args, set(wa))
    groups = score_projections(wa, wb, k=args.k, k_fraction=args.k_fraction, grads=grads)
    numbers = {"a": str(args.a), "b": str(args.b), "kind_a": kind_a, "kind_b": kind_b,
               "k": args.k if args.k is not None else f"max(1, floor({args.k_fraction} * min(d_out, d_in)))",
               "forget": forget, "scores": [s for s in SCORES if s != "forget_alignment" or grads is not None],
               **groups}
    return write_report(out_root, NAME, numbers, _markdown(numbers), {"tensors.png": lambda: _plot(groups)})


def _forget(args: argparse.Namespace, names: set[str]) -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
    """The forget gradients at A and what was used (data, samples, loss)."""
    from mmrlvr.analysis.tokens import model_of, run_of
    from mmrlvr.config import RunConfig, load_config
    from mmrlvr.data.prompts import answer_format
    from mmrlvr.train.data import load_split

    if args.forget_limit < 1:
        raise UserError(f"--forget-limit must be at least 1, got {args.forget_limit}")
    loaded = model_of(args.a)
    run = loaded.run_dir or run_of(args.b)
    data_cfg = load_config(run / "config.yaml").data if run is not None else RunConfig().data
    samples = load_split(args.forget, data_cfg, "test")[: args.forget_limit]
    if not samples:
        raise UserError(f"--forget {args.forget}: no samples")
    fmt = answer_format(data_cfg)
    grads, loss = forget_gradients(loaded, samples, fmt, names)
    return grads, {"data": args.forget, "samples": len(samples), "answer_format": fmt, "nll_at_a": loss}


def _table(rows: list[dict[str, Any]], forget: bool) -> str:
    from mmrlvr.analysis.report import markdown_table

    head = ["rank", "projection", "k", "off-principal energy", "(random ΔW)", "‖ΔW‖", "‖ΔW‖/‖W_A‖"]
    head += ["abs ⟨∇L_forget, ΔW⟩"] if forget else []
    head += ["rank sum"]
    body = []
    for r in rows:
        line = [r["rank"], f"L{r['layer']}.{r['module']}", r["k"], r["off_principal_energy"], r["random_energy"],
                r["delta_norm"],
                r["relative_delta_norm"] if r["relative_delta_norm"] is not None else "–"]
        line += [r["forget_alignment"]] if forget else []
        body.append(line + [r["rank_sum"]])
    return markdown_table(head, body)


def _markdown(n: dict[str, Any]) -> str:
    forget = n["forget"] is not None
    parts = ["# Which projections carry the update (MAST, arXiv 2606.19222)", "",
             f"ΔW = W_B − W_A, A = `{n['a']}` ({n['kind_a']}), B = `{n['b']}` ({n['kind_b']}); k = {n['k']} top left "
             "singular directions of W_A. Off-principal energy = ‖(I − U_k U_kᵀ)ΔW‖² / ‖ΔW‖² (1: the update "
             "leaves W_A's principal output directions); an update in a random direction scores 1 − k/d_out on average "
             "(the \"random ΔW\" column).", "",
             ("Forget set: " + f"`{n['forget']['data']}`, {n['forget']['samples']} samples, NLL at A "
              f"{n['forget']['nll_at_a']:.4g}." if forget else "No forget set (--forget): ranked by two scores."), "",
             "Rank sum: each projection ranked by each score (1 = largest), ranks summed, smallest sum first. "
             "**How the scores are combined is our reading**: the paper is not explicit about it.", "",
             "## Attention projections", "", _table(n.get("attention", []), forget)]
    if n.get("mlp"):
        moved = any(r["delta_norm"] > 0 for r in n["mlp"])
        parts += ["", "## MLP projections (ranked separately)", "",
                  _table(n["mlp"], forget) if moved else "ΔW = 0 on every MLP projection (e.g. LoRA on attention only)."]
    return "\n".join(parts)


def _plot(groups: dict[str, list[dict[str, Any]]]):
    import matplotlib.pyplot as plt

    rows = sorted(groups.get("attention", []), key=lambda r: (r["layer"], ATTENTION.index(r["module"])))
    labels = [f"L{r['layer']}.{r['module'][0]}" for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(5.0, 0.35 * len(rows) + 2), 5), sharex=True)
    ax1.bar(range(len(rows)), [r["off_principal_energy"] for r in rows], color="tab:blue")
    ax1.scatter(range(len(rows)), [r["random_energy"] for r in rows], marker="_", s=200, color="k",
                label="random ΔW (1 − k/d_out)")
    ax1.legend(fontsize=7, loc="lower right")
    ax1.set_ylabel("off-principal\nenergy")
    ax1.set_ylim(0, 1.05)
    ax2.bar(range(len(rows)), [r["delta_norm"] for r in rows], color="tab:orange")
    ax2.set_ylabel("‖ΔW‖")
    ax2.set_xticks(range(len(rows)))
    ax2.set_xticklabels(labels, rotation=90, fontsize=7)
    fig.suptitle("attention projections: where the update goes")
    return fig
