"""``mmrlvr analyze trajectory RUN_DIR``: is each weight's RL update one direction moving linearly in time?

The paper: RELEX (arXiv 2605.21468) observes that RL fine-tuning moves each weight matrix along (nearly) one
fixed direction, with a coefficient that grows (nearly) linearly in the step, so a late checkpoint can be
extrapolated from early ones.

What we compute, per parameter tensor, from the run's saved steps t_1 < ... < t_T and its base model W_0
(``RunCheckpoints.base_folder()``; LoRA checkpoints merged, ΔW = B·A·scale):

- ``M`` [T, numel]: row i is ΔW_{t_i} = W_{t_i} − W_0, flattened;
- the singular values σ_1 ≥ σ_2 ≥ ... of M, from the T×T Gram matrix G = M·Mᵀ (eigenvalues σ_j²; cheap, T is
  small; accumulated in float64 over column chunks);
- rank-1 explained variance ``EV = σ_1² / Σ_j σ_j²`` (1 = every saved update is a multiple of one direction);
- the direction v_1 (first right singular vector, unit norm, sign chosen so that c(t_T) ≥ 0) and the
  coefficients c(t) = ⟨ΔW_t, v_1⟩ (= σ_1·u_1);
- a least-squares line c(t) ≈ a + b·t over the saved steps (intercept free: the first save is at step
  ``save_every``, not 0) and its R² = 1 − SS_res / SS_tot (1.0 when c is constant, so the line fits exactly;
  reported as null with only 2 saved steps, where any line fits);
- ``--extrapolate S``: Ŵ(S) = W_0 + (a + b·S)·v_1 per changed tensor; unchanged tensors stay W_0.

Only tensors that changed are reported (max_t ‖ΔW_t‖ > 1e-9·‖W_0‖; a LoRA run changes only its adapted
layers, ``freeze_vision`` leaves the vision tower). Summary numbers: EV and R² weighted by each tensor's update
energy ‖M‖_F² = Σ_t ‖ΔW_t‖² (the energy-weighted EV is Σ σ_1² / Σ ‖M‖_F²: the share of all update energy that
per-tensor rank-1 trajectories capture), the numel-weighted and median EV, and the same rank-1 analysis of the
whole model as one vector (its Gram matrix is the sum of the per-tensor ones).

Our reading, where the paper is not explicit to us: we fit the line over saved steps only (no forced origin),
pick v_1 per tensor (not one direction per layer or model), and weight the summary by update energy. The
extrapolated model is written as a checkpoint-shaped folder (a ``save_pretrained`` model + processor files +
``state.json`` + ``manifest.json``) under ``RUN_DIR/analysis/trajectory/extrapolated-step-S/``, outside
``checkpoints/`` so resuming never picks it up; ``mmrlvr eval --model FOLDER --data ...`` and
``mmrlvr export FOLDER --out ...`` take it. Its held-out accuracy is measured beside the base model's and each
real checkpoint's with the eval command's functions (``load_eval_samples`` + ``evaluate_samples``: greedy
accuracy, avg@k, pass@k at the run's eval temperature, seed and ``rollout.max_new_tokens``) on the first
``--eval-limit`` prompts of the run's eval data with ``--eval-k`` samples each (small defaults: a coarse check).

Memory: W_0 plus T deltas of the changed tensors in float32 (a LoRA run: only the adapted layers).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmrlvr.errors import UserError

if TYPE_CHECKING:
    import torch

    from mmrlvr.analysis.checkpoints import RunCheckpoints

NAME = "trajectory"
CHANGED_TOL = 1e-9  # a tensor changed when max_t ‖ΔW_t‖ > CHANGED_TOL · ‖W_0‖ (and > 0)
_CHUNK = 1 << 22  # columns per Gram-matrix block


# ------------------------------------------------------------------------------------------- tensor math
def gram(rows: list["torch.Tensor"]) -> "torch.Tensor":
    """G [T, T] float64 = M·Mᵀ for M [T, n] given as T flat rows of n elements (built in column blocks)."""
    import torch

    n = rows[0].numel()
    g = torch.zeros(len(rows), len(rows), dtype=torch.float64)
    for start in range(0, n, _CHUNK):
        block = torch.stack([r.reshape(-1)[start:start + _CHUNK] for r in rows]).to(torch.float64)
        g += block @ block.T
    return g


def rank1_of_gram(g: "torch.Tensor") -> tuple[float, list[float], "torch.Tensor"]:
    """(EV = σ_1²/Σσ², σ² descending, u_1 [T] float64) of a Gram matrix G [T, T] = M·Mᵀ.

    u_1 is the first left singular vector of M, signed so that its last entry is ≥ 0 (entry sum when 0).
    EV is 0.0 for M = 0.
    """
    import torch

    vals, vecs = torch.linalg.eigh(g)  # ascending
    vals = vals.flip(0).clamp_min(0.0)
    vecs = vecs.flip(1)
    u1 = vecs[:, 0].clone()
    if u1[-1] < 0 or (u1[-1] == 0 and u1.sum() < 0):
        u1 = -u1
    total = float(vals.sum())
    ev = float(vals[0]) / total if total > 0 else 0.0
    return ev, [float(v) for v in vals], u1


def first_direction(rows: list["torch.Tensor"], u1: "torch.Tensor", sigma1: float) -> "torch.Tensor":
    """v_1 [n] float32 = Mᵀ·u_1 / σ_1 (unit norm) for M [T, n] given as T flat rows."""
    import torch

    v = torch.zeros(rows[0].numel(), dtype=torch.float64)
    for w, r in zip(u1.tolist(), rows):
        if w != 0.0:
            v += w * r.reshape(-1).to(torch.float64)
    return (v / sigma1).to(torch.float32) if sigma1 > 0 else v.to(torch.float32)


def linear_fit(t: list[float], c: list[float]) -> tuple[float, float, float | None]:
    """(a, b, R²) of the least-squares line c ≈ a + b·t; R² is None with fewer than 3 points (any line
    through 2 points fits) and 1.0 when c is constant (the flat line fits exactly)."""
    import torch

    x = torch.tensor(t, dtype=torch.float64)
    y = torch.tensor(c, dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], dim=1)
    coef = torch.linalg.lstsq(design, y.unsqueeze(1), driver="gelsd").solution.squeeze(1)
    a, b = float(coef[0]), float(coef[1])
    if len(t) < 3:
        return a, b, None
    ss_res = float(((y - design @ coef) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    scale = float((y ** 2).sum())
    if ss_tot <= 1e-12 * max(scale, 1e-300):
        return a, b, 1.0 if ss_res <= 1e-12 * max(scale, 1e-300) else 0.0
    return a, b, max(0.0, 1.0 - ss_res / ss_tot)


@dataclasses.dataclass
class Trajectory:
    """The rank-1 trajectory of one tensor (or the whole model) over the saved steps."""

    explained: float  # σ_1² / Σ σ_j²
    sigma2: list[float]  # σ_j², descending
    coefficients: list[float]  # c(t) = ⟨ΔW_t, v_1⟩ per saved step
    intercept: float  # a of c ≈ a + b·t
    slope: float  # b
    r2: float | None
    direction: "torch.Tensor | None"  # v_1 [n] (None for the whole-model summary)

    def coefficient_at(self, step: float) -> float:
        return self.intercept + self.slope * step


def trajectory_of_gram(g: "torch.Tensor", steps: list[int]) -> tuple[Trajectory, "torch.Tensor"]:
    """(Trajectory without direction, u_1) from a Gram matrix G [T, T] and the T steps."""
    ev, s2, u1 = rank1_of_gram(g)
    sigma1 = math.sqrt(s2[0])
    c = [sigma1 * float(x) for x in u1]
    a, b, r2 = linear_fit([float(s) for s in steps], c)
    return Trajectory(ev, s2, c, a, b, r2, None), u1


def tensor_trajectory(deltas: list["torch.Tensor"], steps: list[int]) -> Trajectory:
    """The rank-1 trajectory of one tensor from its T deltas ΔW_t (any shape, all alike) at ``steps``."""
    traj, u1 = trajectory_of_gram(gram(deltas), steps)
    traj.direction = first_direction(deltas, u1, math.sqrt(traj.sigma2[0])).reshape(deltas[0].shape)
    return traj


def extrapolate(w0: "torch.Tensor", traj: Trajectory, step: float) -> "torch.Tensor":
    """Ŵ(step) = W_0 + (a + b·step)·v_1, same shape and dtype as ``w0``."""
    assert traj.direction is not None
    return (w0.to(traj.direction.dtype) + traj.coefficient_at(step) * traj.direction).to(w0.dtype)


# ------------------------------------------------------------ model folders and held-out eval (shared)
def write_weights_checkpoint(weights: dict[str, "torch.Tensor"], skeleton: str | Path, out: Path, *,
                             processor_from: str | Path, step: int, info: dict[str, Any],
                             dtype: str = "float32", base_model: str | Path | None = None) -> Path:
    """A checkpoint-shaped model folder at ``out``: ``save_pretrained`` of the ``skeleton`` model folder's
    architecture with ``weights`` (plain parameter names; a name not given keeps the skeleton's value), the
    processor files of ``processor_from``, ``state.json`` (``weights: transformers``, no LoRA, ``base_model``
    (default: the skeleton), ``info``) and
    ``manifest.json`` last. Built beside ``out`` and renamed in; an existing ``out`` is replaced. ``mmrlvr eval
    --model`` loads it as a checkpoint (``state.json``), ``mmrlvr export`` verifies and exports it."""
    import torch

    from mmrlvr.models import load_policy
    from mmrlvr.store.atomic import atomic_write_json
    from mmrlvr.train.checkpoint import FORMAT_VERSION, PROCESSOR_FILES, STATE, quiet_progress, write_manifest

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with quiet_progress():
        model, _ = load_policy(str(skeleton), dtype=dtype)
    params = dict(model.named_parameters())
    unknown = sorted(set(weights) - set(params))
    if unknown:
        raise UserError(f"{skeleton}: the model has no parameter {unknown[0]!r} to write")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value.to(params[name].dtype))
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with quiet_progress():
            model.save_pretrained(str(tmp), safe_serialization=True)
        for name in PROCESSOR_FILES:
            if (Path(processor_from) / name).is_file():
                shutil.copy2(Path(processor_from) / name, tmp / name)
        atomic_write_json(tmp / STATE, {"step": int(step), "format": FORMAT_VERSION, "weights": "transformers",
                                        "lora": None, "base_model": str(Path(base_model or skeleton).resolve()),
                                        **info})
        write_manifest(tmp, int(step))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


@dataclasses.dataclass
class HeldOut:
    """Held-out prompts and the eval settings to score models on them (the ``mmrlvr eval`` functions)."""

    samples: list
    data: str
    k: int
    temperature: float
    max_new_tokens: int
    seed: int

    def settings(self) -> dict[str, Any]:
        return {"data": self.data, "n": len(self.samples), "k": self.k, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed}

    def score(self, model: Any, processor: Any) -> dict[str, Any]:
        """greedy accuracy, avg@k, pass@k, format rates of ``model`` (``evaluate_samples``, answer judge)."""
        from mmrlvr.rollout.hf import HFEngine
        from mmrlvr.train.heldout import evaluate_samples

        model.eval()
        return evaluate_samples(HFEngine(model, processor), self.samples, k=self.k, temperature=self.temperature,
                                max_new_tokens=self.max_new_tokens, seed=self.seed, progress=False)

    def accuracy_row(self, result: dict[str, Any]) -> list[Any]:
        row = [result["greedy_accuracy"]]
        if self.k > 0:
            row += [result[f"avg@{self.k}"], result[f"pass@{self.k}"]]
        return row

    def accuracy_header(self) -> list[str]:
        return ["greedy acc"] + ([f"avg@{self.k}", f"pass@{self.k}"] if self.k > 0 else [])


def held_out(cfg: Any, data: str | None, limit: int, k: int, *, max_new_tokens: int | None = None,
             what: str = "the run", hint: str = "or --eval-limit 0 for no held-out accuracy") -> HeldOut:
    """The first ``limit`` prompts of ``data`` (default: the config's ``data.eval``), as ``mmrlvr eval`` loads
    them; sampling settings from the config (temperature, seed, ``rollout.max_new_tokens``)."""
    from mmrlvr.train.heldout import load_eval_samples

    spec = data or cfg.data.eval
    if not spec:
        raise UserError(f"{what} has no eval data (data.eval): pass --eval-data DATASET, {hint}")
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, limit=limit))
    samples = load_eval_samples(cfg, spec)
    return HeldOut(samples, spec, k, cfg.eval.temperature, max_new_tokens or cfg.rollout.max_new_tokens, cfg.seed)


def finite(x: float | None) -> float | None:
    """``x``, or None where JSON has no number (NaN, ±inf)."""
    return x if x is not None and math.isfinite(x) else None


# ---------------------------------------------------------------------------------------------- runner
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN_DIR", help="run directory with at least 2 saved checkpoints")
    p.add_argument("--extrapolate", type=int, default=None, metavar="STEP",
                   help="write W_0 + ĉ(STEP)·v_1 per tensor as a model folder (analysis/trajectory/"
                        "extrapolated-step-STEP) and compare its held-out accuracy with the real checkpoints'")
    p.add_argument("--top", type=int, default=8, metavar="N",
                   help="tensors (largest update energy) in the table and the c(t) plot (default 8)")
    p.add_argument("--eval-limit", type=int, default=8, metavar="N",
                   help="with --extrapolate: held-out prompts per model (default 8; 0 = no eval)")
    p.add_argument("--eval-k", type=int, default=2, metavar="K",
                   help="samples per prompt for avg@k / pass@k in that eval (default 2; 0 = greedy only)")
    p.add_argument("--eval-data", default=None, metavar="DATASET", help="eval data (default: the run's data.eval)")


def _load_run_config(run_dir: Path) -> Any:
    from mmrlvr.config import load_config

    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: no config.yaml (needed for the eval settings; --eval-limit 0 skips the eval)")
    return load_config(run_dir / "config.yaml")


def collect_deltas(base: dict[str, "torch.Tensor"], folders: list[Path], steps: list[int]
                   ) -> dict[str, list["torch.Tensor"]]:
    """{name: [ΔW_t for each checkpoint]} for the tensors that changed at some step (others left out)."""
    import torch

    from mmrlvr.analysis.checkpoints import check_same_model, checkpoint_weights

    kept: dict[str, list[torch.Tensor | None]] = {}
    for i, (folder, step) in enumerate(zip(folders, steps)):
        weights = checkpoint_weights(folder)
        check_same_model(base, weights, "the base model", f"checkpoint step {step}")
        for name, w0 in base.items():
            d = weights[name] - w0
            if float(d.norm()) > CHANGED_TOL * float(w0.norm()) and bool(d.any()):
                kept.setdefault(name, [None] * len(folders))[i] = d
        del weights
    return {n: [d if d is not None else torch.zeros_like(base[n]) for d in ds] for n, ds in kept.items()}


def run(args: argparse.Namespace) -> Path:
    """``mmrlvr analyze trajectory``: the rank-1 trajectory of every changed tensor and of the whole model,
    optionally extrapolated to ``--extrapolate`` and scored on held-out prompts; writes the report."""
    from mmrlvr.analysis.checkpoints import base_weights, run_checkpoints
    from mmrlvr.analysis.report import write_report
    from mmrlvr.train.checkpoint import quiet_progress

    _check_args(args)
    run_dir = Path(args.run)
    ckpts = run_checkpoints(run_dir, at_least=2)
    steps = ckpts.steps
    evaluating = args.extrapolate is not None and args.eval_limit > 0
    cfg = _load_run_config(run_dir) if evaluating else None
    heldout = held_out(cfg, args.eval_data, args.eval_limit, args.eval_k) if evaluating else None
    base_folder = ckpts.base_folder()
    with quiet_progress():
        base = base_weights(base_folder)
        deltas = collect_deltas(base, ckpts.folders, steps)
    if not deltas:
        raise UserError(f"{run_dir}: no weight differs from the base model {base_folder} at any saved step")

    rows, trajs, g_total = _tensor_rows(base, deltas, steps, with_direction=args.extrapolate is not None)
    whole, _ = trajectory_of_gram(g_total, steps)
    summary = _summary(rows, base, whole, ckpts, base_folder)
    numbers: dict[str, Any] = {"summary": summary, "tensors": rows}

    out_dir = run_dir / "analysis" / NAME
    evals: list[dict[str, Any]] = []
    if args.extrapolate is not None:
        step = int(args.extrapolate)
        folder, numbers["extrapolated"] = _write_extrapolated(base, trajs, step, ckpts, base_folder, run_dir,
                                                              out_dir, cfg)
        if heldout is not None:
            evals = _evaluate_all(heldout, base_folder, ckpts.folders, steps, folder, step, cfg)
            numbers["eval"] = {"settings": heldout.settings(), "results": evals}

    top = sorted(rows, key=lambda r: -r["energy"])[: args.top]
    md = _markdown(summary, top, numbers, heldout, evals, len(rows))
    plots = {"explained_variance.png": lambda: _plot_ev(rows),
             "coefficients.png": lambda: _plot_coefficients(top, whole, steps, args.extrapolate)}
    return write_report(run_dir, NAME, numbers, md, plots)


def _check_args(args: argparse.Namespace) -> None:
    """UserError for a ``--top`` below 1 or an ``--extrapolate`` step that is not positive (checked before
    any checkpoint is read)."""
    if args.top < 1:
        raise UserError(f"--top {args.top}: must be at least 1")
    if args.extrapolate is not None and args.extrapolate <= 0:
        raise UserError(f"--extrapolate {args.extrapolate}: must be a positive step")


def _tensor_rows(base: dict[str, "torch.Tensor"], deltas: dict[str, list["torch.Tensor"]], steps: list[int], *,
                 with_direction: bool) -> tuple[list[dict[str, Any]], dict[str, Trajectory], "torch.Tensor"]:
    """(one report row per changed tensor, its ``Trajectory`` by name, the sum of the per-tensor Gram
    matrices: the whole model's Gram matrix). Each trajectory carries its direction v_1 only
    ``with_direction`` (extrapolation needs it; it costs a pass over the deltas)."""
    import torch

    rows: list[dict[str, Any]] = []
    trajs: dict[str, Trajectory] = {}
    g_total = torch.zeros(len(steps), len(steps), dtype=torch.float64)
    for name, ds in deltas.items():
        g = gram(ds)
        g_total += g
        traj, u1 = trajectory_of_gram(g, steps)
        if with_direction:
            traj.direction = first_direction(ds, u1, math.sqrt(traj.sigma2[0])).reshape(ds[0].shape)
        trajs[name] = traj
        rows.append(_tensor_row(name, base[name], g, traj))
    return rows, trajs, g_total


def _tensor_row(name: str, w0: "torch.Tensor", g: "torch.Tensor", traj: Trajectory) -> dict[str, Any]:
    """The report row of one changed tensor: its size, update energy (trace of its Gram matrix ``g``), the
    last saved update's norm (absolute and relative to ‖W_0‖) and its rank-1 trajectory."""
    import torch

    energy = float(torch.diagonal(g).sum())
    w0_norm = float(w0.norm())
    last = math.sqrt(float(g[-1, -1]))
    return {"name": name, "numel": w0.numel(), "energy": energy, "delta_norm_last": last,
            "relative_change_last": finite(last / w0_norm) if w0_norm > 0 else None,
            "explained_variance": traj.explained,
            "second_variance": traj.sigma2[1] / sum(traj.sigma2) if len(traj.sigma2) > 1 and energy > 0
            else 0.0,
            "r2": traj.r2, "intercept": traj.intercept, "slope": traj.slope,
            "coefficients": traj.coefficients}


def _summary(rows: list[dict[str, Any]], base: dict[str, "torch.Tensor"], whole: Trajectory,
             ckpts: "RunCheckpoints", base_folder: str) -> dict[str, Any]:
    """The report's summary: counts, EV weighted by update energy and by numel, the median EV, the
    energy-weighted R² (None when no tensor has one) and the whole model's trajectory."""
    import torch

    energies = [r["energy"] for r in rows]
    numels = [r["numel"] for r in rows]
    evs = [r["explained_variance"] for r in rows]
    with_r2 = [(r["r2"], r["energy"]) for r in rows if r["r2"] is not None]
    return {
        "steps": ckpts.steps, "base_model": base_folder, "lora": ckpts.lora,
        "tensors": len(base), "changed_tensors": len(rows),
        "changed_params": sum(numels), "total_params": sum(t.numel() for t in base.values()),
        "explained_variance_energy_weighted": sum(e * v for e, v in zip(energies, evs)) / sum(energies),
        "explained_variance_numel_weighted": sum(n * v for n, v in zip(numels, evs)) / sum(numels),
        "explained_variance_median": float(torch.tensor(evs, dtype=torch.float64).median()),
        "r2_energy_weighted": (sum(r * e for r, e in with_r2) / sum(e for _, e in with_r2)
                               if with_r2 and sum(e for _, e in with_r2) > 0 else None),
        "whole_model": {"explained_variance": whole.explained, "r2": whole.r2, "intercept": whole.intercept,
                        "slope": whole.slope, "coefficients": whole.coefficients},
        "weighting": "energy = sum over saved steps of ||W_t - W_0||_F^2 per tensor",
    }


def _write_extrapolated(base: dict[str, "torch.Tensor"], trajs: dict[str, Trajectory], step: int,
                        ckpts: "RunCheckpoints", base_folder: str, run_dir: Path, out_dir: Path,
                        cfg: Any) -> tuple[Path, dict[str, Any]]:
    """(folder, report entry) of the model extrapolated to ``step``: W_0 + ĉ(step)·v_1 for each changed
    tensor, written under ``out_dir`` with the last checkpoint's processor files and the run's dtype
    (float32 without a config). The extrapolated weights are dropped on return, before any eval loads a
    model."""
    from mmrlvr.train.checkpoint import read_state
    from mmrlvr.train.export import processor_source

    new = {name: extrapolate(base[name], trajs[name], step) for name in trajs}
    last_state = read_state(ckpts.folders[-1])
    steps = ckpts.steps
    folder = write_weights_checkpoint(
        new, base_folder, out_dir / f"extrapolated-step-{step}",
        processor_from=processor_source(ckpts.folders[-1], last_state), step=step,
        dtype=cfg.model.dtype if cfg is not None else "float32",
        info={"analysis": {"name": "trajectory", "run": str(run_dir.resolve()), "extrapolated_step": step,
                           "from_steps": steps, "lora_run": ckpts.lora}})
    return folder, {"step": step, "folder": str(folder), "tensors_moved": len(new),
                    "beyond_last_saved_step": step > steps[-1]}


def _evaluate_all(heldout: HeldOut, base_folder: str, folders: list[Path], steps: list[int], extrap: Path,
                  extrap_step: int, cfg: Any) -> list[dict[str, Any]]:
    """Held-out scores of the base model, every real checkpoint and the extrapolated folder, in that order."""
    from mmrlvr.models import load_policy
    from mmrlvr.train.checkpoint import quiet_progress
    from mmrlvr.train.export import load_checkpoint_model

    out = []
    with quiet_progress():
        model, processor = load_policy(base_folder, dtype=cfg.model.dtype)
    out.append({"model": "base", "step": 0, **heldout.score(model, processor)})
    for folder, step in [*zip(folders, steps), (extrap, extrap_step)]:
        with quiet_progress():
            model, processor, _ = load_checkpoint_model(folder, dtype=cfg.model.dtype)
        out.append({"model": "extrapolated" if folder == extrap else "checkpoint", "step": step,
                    **heldout.score(model, processor)})
        del model
    return out


def _markdown(summary: dict, top: list[dict], numbers: dict, heldout: HeldOut | None, evals: list[dict],
              n_changed: int) -> str:
    from mmrlvr.analysis.report import markdown_table

    def num(x: float | None) -> Any:
        return "n/a" if x is None else float(x)

    whole = summary["whole_model"]
    lines = [
        "# Weight trajectory: rank-1 structure of the RL updates (RELEX, arXiv 2605.21468)", "",
        f"Saved steps {summary['steps']} against the base model `{summary['base_model']}`"
        f"{' (LoRA run: adapters merged)' if summary['lora'] else ''}. "
        f"{summary['changed_tensors']} of {summary['tensors']} tensors changed "
        f"({summary['changed_params']:,} of {summary['total_params']:,} parameters).", "",
        markdown_table(["summary", "value"], [
            ["rank-1 explained variance, energy-weighted", summary["explained_variance_energy_weighted"]],
            ["rank-1 explained variance, numel-weighted", summary["explained_variance_numel_weighted"]],
            ["rank-1 explained variance, median tensor", summary["explained_variance_median"]],
            ["R² of c(t) linear, energy-weighted", num(summary["r2_energy_weighted"])],
            ["whole model as one vector: explained variance", whole["explained_variance"]],
            ["whole model as one vector: R² of c(t)", num(whole["r2"])],
        ]), "",
        "Explained variance = σ₁²/Σσᵢ² of the [steps × numel] matrix of ΔW_t = W_t − W_0 (1: one direction); "
        "c(t) = ⟨ΔW_t, v₁⟩ and R² of its least-squares line over the saved steps (n/a with 2 steps). "
        "Energy = Σ_t ‖ΔW_t‖²_F per tensor.", "",
        f"## Top {len(top)} of {n_changed} changed tensors by update energy", "",
        markdown_table(["tensor", "numel", "‖ΔW_last‖", "‖ΔW‖/‖W₀‖", "explained var", "R²", "slope of c(t)"],
                       [[r["name"], r["numel"], r["delta_norm_last"], num(r["relative_change_last"]),
                         r["explained_variance"], num(r["r2"]), r["slope"]] for r in top]),
    ]
    ext = numbers.get("extrapolated")
    if ext:
        lines += ["", f"## Extrapolated to step {ext['step']}", "",
                  f"`{ext['folder']}`: W₀ + (a + b·{ext['step']})·v₁ for the {ext['tensors_moved']} changed tensors "
                  "(the others are W₀), a full-weights model folder with state.json + manifest.json; "
                  "`mmrlvr eval --model FOLDER --data DATASET` and `mmrlvr export FOLDER --out DIR` take it."]
    if heldout is not None and evals:
        s = heldout.settings()
        lines += ["", f"Held-out accuracy on the first {s['n']} prompts of `{s['data']}` (k={s['k']}, "
                  f"temperature {s['temperature']}, max {s['max_new_tokens']} new tokens, seed {s['seed']}; "
                  "a coarse check):", "",
                  markdown_table(["model", "step", *heldout.accuracy_header()],
                                 [[e["model"], e["step"], *heldout.accuracy_row(e)] for e in evals])]
    return "\n".join(lines)


def _plot_ev(rows: list[dict]):
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, max(3.5, 0.22 * min(len(rows), 40) + 1)),
                                   gridspec_kw={"width_ratios": [1, 1.6]}, layout="constrained")
    evs = [r["explained_variance"] for r in rows]
    ax1.hist(evs, bins=20, range=(0, 1), weights=[r["energy"] for r in rows], color="tab:blue", alpha=0.8)
    ax1.set_xlabel("rank-1 explained variance σ₁²/Σσ²")
    ax1.set_ylabel("update energy Σ‖ΔW_t‖² in bin")
    ax1.set_title(f"{len(rows)} changed tensors")
    shown = sorted(rows, key=lambda r: -r["energy"])[:40]
    y = list(range(len(shown)))
    ax2.barh(y, [r["explained_variance"] for r in shown], color="tab:blue", label="explained variance")
    ax2.scatter([r["r2"] if r["r2"] is not None else float("nan") for r in shown], y, color="tab:orange",
                marker="o", zorder=3, label="R² of c(t) linear")
    ax2.set_yticks(y, [r["name"].removeprefix("model.") for r in shown], fontsize=6)
    ax2.invert_yaxis()
    ax2.set_xlim(0, 1.02)
    ax2.set_title(f"per tensor (top {len(shown)} by update energy)")
    ax2.legend(loc="lower left", fontsize=7)
    return fig


def _plot_coefficients(top: list[dict], whole: Trajectory, steps: list[int], extrapolate_to: int | None):
    import matplotlib.pyplot as plt

    panels = [("whole model", whole.coefficients, whole.intercept, whole.slope, whole.r2)]
    panels += [(r["name"].removeprefix("model."), r["coefficients"], r["intercept"], r["slope"], r["r2"])
               for r in top]
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    end = max(steps[-1], extrapolate_to or 0)
    for ax, (title, c, a, b, r2) in zip(axes.flat, panels):
        ax.plot(steps, c, "o", color="tab:blue", label="c(t)")
        ax.plot([0, end], [a, a + b * end], "-", color="tab:orange",
                label=f"a + b·t (R² {'n/a' if r2 is None else f'{r2:.3f}'})")
        if extrapolate_to is not None:
            ax.plot([extrapolate_to], [a + b * extrapolate_to], "*", color="tab:red", markersize=10,
                    label=f"ĉ({extrapolate_to})")
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("step")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return fig
