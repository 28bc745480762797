"""oneDNN vs ATen float32 products on this CPU, at the shapes of a Qwen2.5-VL-3B step (mmrlvr.algos.cpu_linear).

Each product runs through ``torch.nn.functional.linear`` / ``@`` (ATen: MKL's sgemm) and through
``mmrlvr.algos.cpu_linear`` (oneDNN), alternated, median of ``--repeats``; the error of each against a float64
product is printed too, so "faster" is never bought with accuracy.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/cpu_linear.py [--repeats 5]

Ends with ``oneDNN/ATen time, decode head (8 rows): X``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mmrlvr.algos import cpu_linear

V, H, MLP, VIS, VIS_MLP = 151_936, 2_048, 11_008, 1_280, 3_420


def _time(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    if not cpu_linear._onednn_op_works() or not torch.backends.mkldnn.enabled:
        raise SystemExit("oneDNN's float32 linear is not available in this torch")
    torch.manual_seed(0)
    head, up, down = torch.randn(V, H) * 0.02, torch.randn(MLP, H) * 0.02, torch.randn(H, MLP) * 0.02
    qproj, vis = torch.randn(H, H) * 0.02, torch.randn(VIS_MLP, VIS) * 0.02
    cases = []
    for rows in (1, 8, 256):
        cases.append((f"head [{rows}, {H}] x [{V}, {H}]^T", torch.randn(rows, H), head, False))
    cases.append((f"head backward dL/dh: [256, {V}] x [{V}, {H}]", torch.randn(256, V), head, True))
    for rows in (8, 600):
        cases.append((f"MLP up [{rows}, {H}] x [{MLP}, {H}]^T", torch.randn(rows, H), up, False))
        cases.append((f"MLP down [{rows}, {MLP}] x [{H}, {MLP}]^T", torch.randn(rows, MLP), down, False))
        cases.append((f"attention projection [{rows}, {H}] x [{H}, {H}]^T", torch.randn(rows, H), qproj, False))
    cases.append((f"vision MLP [1024, {VIS}] x [{VIS_MLP}, {VIS}]^T", torch.randn(1024, VIS), vis, False))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'product':58s} {'ATen ms':>9s} {'oneDNN ms':>10s} {'ratio':>6s} {'ATen err':>9s} {'oneDNN err':>10s}")
    decode = None
    for name, x, w, as_matmul in cases:
        if as_matmul:
            aten, ours = (lambda: x @ w), (lambda: cpu_linear.matmul(x, w))
            exact = x.double() @ w.double()
        else:
            aten, ours = (lambda: torch.nn.functional.linear(x, w)), (lambda: cpu_linear.linear(x, w))
            exact = torch.nn.functional.linear(x.double(), w.double())
        assert cpu_linear.onednn_applies(x, w.t() if as_matmul else w)
        t_aten, t_ours = _time(aten, a.repeats), _time(ours, a.repeats)
        e_aten = (aten().double() - exact).abs().max().item()
        e_ours = (ours().double() - exact).abs().max().item()
        print(f"{name:58s} {t_aten * 1e3:9.1f} {t_ours * 1e3:10.1f} {t_ours / t_aten:6.2f} {e_aten:9.2e} {e_ours:10.2e}")
        if name.startswith("head [8,"):
            decode = t_ours / t_aten
    print(f"oneDNN/ATen time, decode head (8 rows): {decode:.2f}")


if __name__ == "__main__":
    main()
