"""Metrics of several processes combine into the metrics of the whole batch (``mmrlvr.metric``).

The premise of each test is planted on purpose: the ranks' metric *keys* differ (off-policy bins that hold tokens
on one rank only, a reward component one rank never produced, consistency verdicts on one rank only) and so do
their denominators (uneven shards: 1 group on rank 0, 2 on rank 1). The expected values are the real metric
functions run over the whole global batch in one process.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from mmrlvr.algos.clipping import OffPolicyDiagnostics
from mmrlvr.rollout.base import RolloutBatch
from mmrlvr.metric import STRICT_ENV, Metric, UndeclaredMetric, check_declared, combine, reduce_over_processes
from mmrlvr.train.stages.record import update_metrics
from mmrlvr.train.step_metrics import rollout_metrics
from mmrlvr.types import Completion, RewardResult, Sample

G = 4


def _batch(groups: list[int], lengths: list[int]) -> RolloutBatch:
    n, L = len(groups) * G, max(lengths)
    mask = torch.zeros(n, L)
    for i, k in enumerate(lengths):
        mask[i, :k] = 1.0
    samples = [Sample(id=f"q{g}", messages=[], images=[], answer=str(g % 3), answer_type="number")
               for g in groups for _ in range(G)]
    texts = [f"<think>I count {(i * 7) % 3}.</think><answer>{(i * 5 + g) % 3}</answer>"
             for g in groups for i in range(G)]
    z = torch.zeros(n, L)
    return RolloutBatch(samples=samples, group_index=torch.arange(len(groups)).repeat_interleave(G),
                        sample_index=torch.arange(G).repeat(len(groups)), input_ids=z.long(), attention_mask=z.long(),
                        response_ids=z.long(), response_mask=mask, old_logprobs=z, vision={}, prompt_length=1,
                        completions=[Completion(text=t, finish_reason="length" if i % 5 == 0 else "stop")
                                     for i, t in enumerate(texts)])


def _results(groups: list[int]) -> list[RewardResult]:
    out = []
    for g in groups:
        for i in range(G):
            comps = {"format": float(i % 2), "accuracy": float((i + g) % 3 == 0)}
            if g == 2:  # a component only group 2 has (only rank 1 reports it)
                comps["iou"] = 0.25 * i
            parsed = {}
            if g != 0:  # consistency verdicts on rank 1's rows only
                parsed["consistency"] = {"verdict": ["consistent", "inconsistent", "unknown"][(i + g) % 3],
                                         "thinking_correct": None if i == 3 else bool((i + g) % 2),
                                         "answer_correct": bool(i % 2)}
            out.append(RewardResult(score=comps["format"] * 0.2 + comps["accuracy"] + 0.1 * g, components=comps,
                                    parsed=parsed))
    return out


def _offpolicy(ratio: torch.Tensor, old_p: torch.Tensor) -> OffPolicyDiagnostics:
    d = OffPolicyDiagnostics()
    d.add(ratio, old_p.log(), torch.ones_like(ratio, dtype=torch.bool))
    return d


def _rank_metrics(groups, lengths, ratio, old_p, stats):
    batch, results = _batch(groups, lengths), _results(groups)
    rewards = torch.tensor([r.score for r in results])
    m = rollout_metrics(batch, rewards, results, G)
    m.update(update_metrics(stats))
    m.update(_offpolicy(ratio, old_p).metrics())
    m["reward/dropped_rows"] = Metric.sum(float(len(groups) - 1))
    return m


def _stats(ratio: torch.Tensor, kl: torch.Tensor, loss: float, grad_norm: float) -> dict[str, float]:
    n = float(ratio.numel())
    return {"loss": loss, "grad_norm": grad_norm, "kl_sum": float(kl.sum()), "tokens": n,
            "entropy_sum": float(kl.sum() * 2), "clip_sum": float(((ratio - 1).abs() > 0.2).sum()),
            "ratio_sum": float(ratio.sum()), "ratio_max": float(ratio.max())}


def test_reduced_metrics_equal_the_global_batch_with_rank_dependent_keys_and_denominators():
    gen = torch.Generator().manual_seed(0)
    # rank 0: 1 group, pi_old only in the high bins; rank 1: 2 groups, pi_old across the low bins too
    r0, p0 = 1 + 0.3 * torch.randn(7, generator=gen), 0.55 + 0.4 * torch.rand(7, generator=gen)
    r1, p1 = 1 + 0.3 * torch.randn(19, generator=gen), 0.9 * torch.rand(19, generator=gen) + 0.01
    k0, k1 = torch.rand(7, generator=gen), torch.rand(19, generator=gen)
    len0, len1 = [3, 5, 2, 4], [1, 6, 6, 2, 3, 5, 4, 2]
    # each rank's loss is its share of the globally normalised loss; gradients were all-reduced (same norm)
    m0 = _rank_metrics([0], len0, r0, p0, _stats(r0, k0, 0.3, 1.5))
    m1 = _rank_metrics([1, 2], len1, r1, p1, _stats(r1, k1, -0.1, 1.5))
    assert set(m0) != set(m1), "the premise: the ranks report different keys"
    assert any(k.startswith("offpolicy/bin") for k in set(m1) - set(m0))
    assert "reward/iou" in m1 and "reward/iou" not in m0 and "inconsistency_rate" not in m0

    ratio, old_p, kl = torch.cat([r0, r1]), torch.cat([p0, p1]), torch.cat([k0, k1])
    want = _rank_metrics([0, 1, 2], len0 + len1, ratio, old_p, _stats(ratio, kl, 0.2, 1.5))
    want["reward/dropped_rows"] = 0.0 + 1.0  # a count: 0 dropped on rank 0, 1 on rank 1
    got = combine([m0, m1])
    assert set(got) == set(want)
    for k in want:
        assert math.isclose(got[k], want[k], rel_tol=1e-6, abs_tol=1e-9), (k, got[k], want[k])  # float32 sums
    # the kinds the test exercises, as the producers declared them
    assert {got[k].kind for k in ("offpolicy/bin3/tokens", "ratio/max", "reward/std", "inconsistency_rate",
                                  "grad_norm")} == {"sum", "max", "std", "mean", "same"}


def test_one_rank_combines_to_itself():
    gen = torch.Generator().manual_seed(1)
    r, p = 1 + 0.2 * torch.randn(11, generator=gen), torch.rand(11, generator=gen) * 0.98 + 0.01
    m = _rank_metrics([0, 1, 2], [3] * 12, r, p, _stats(r, torch.rand(11, generator=gen), 0.5, 2.0))
    got = combine([m])
    for k in m:
        assert math.isclose(got[k], m[k], rel_tol=1e-12, abs_tol=1e-12), k


def test_a_plugins_metrics_declare_their_own_reduction():
    a = {"myplugin/rate": Metric.mean(0.5, n=2), "myplugin/steps_seen": Metric.sum(3.0), "lr": Metric.same(1e-4),
         "note": "x"}
    b = {"myplugin/rate": Metric.mean(1.0, n=6), "myplugin/steps_seen": Metric.sum(4.0), "lr": Metric.same(1e-4)}
    got = combine([a, b])
    assert got["myplugin/rate"] == pytest.approx((0.5 * 2 + 1.0 * 6) / 8) and got["myplugin/rate"].n == 8
    assert got["myplugin/steps_seen"] == 7.0 and got["lr"] == 1e-4 and got["note"] == "x"
    # a rate with nothing to count on one process takes no part in the mean
    assert combine([{"r": Metric.mean(0.0, n=0)}, {"r": Metric.mean(0.25, n=4)}])["r"] == 0.25


def test_a_metric_is_a_float_that_keeps_its_reduction_when_it_travels():
    import json
    import pickle

    m = Metric.std(0.5, n=4, mean=1.25, unbiased=True)
    back = pickle.loads(pickle.dumps(m))  # how processes exchange them (all_gather_object)
    assert (type(back), float(back), back.kind, back.n, back.mean_of, back.unbiased) == (Metric, 0.5, "std", 4.0,
                                                                                          1.25, True)
    assert json.dumps({"x": m}) == '{"x": 0.5}' and f"{m:.2f}" == "0.50" and m * 2 == 1.0
    assert type(m + 1) is float  # arithmetic gives plain numbers: a derived value declares its own reduction
    with pytest.raises(ValueError, match="unknown reduction kind"):
        Metric(1.0, "median")
    with pytest.raises(ValueError, match="needs its count n"):
        Metric(1.0, "mean")
    with pytest.raises(ValueError, match="needs the mean"):
        Metric(1.0, "std", n=3)


def test_an_undeclared_metric_is_an_error_under_strict_and_averaged_with_a_warning_otherwise(monkeypatch):
    ranks = [{"myplugin/plain": 1.0, "ok": Metric.sum(1.0)}, {"myplugin/plain": 3.0, "ok": Metric.sum(2.0)}]
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(UndeclaredMetric, match=r"myplugin/plain declare no reduction.*Metric.sum"):
        combine(ranks)
    with pytest.raises(UndeclaredMetric, match="myplugin/plain"):
        check_declared(ranks[0])  # what the record stage runs on every step, one process included
    monkeypatch.setenv(STRICT_ENV, "0")
    with pytest.warns(UserWarning, match="myplugin/plain declare no reduction"):
        got = combine(ranks)
    assert got["myplugin/plain"] == 2.0 and got["ok"] == 3.0


def test_processes_that_disagree_on_a_metrics_reduction_are_an_error():
    with pytest.raises(ValueError, match="'x': processes declare different reductions: max, sum"):
        combine([{"x": Metric.sum(1.0)}, {"x": Metric.max(2.0)}])


def test_tool_counts_sum_and_tool_rates_average_and_the_module_needs_no_torch():
    from mmrlvr.tools.runner import ERROR_KINDS, ToolCounters

    counters = ToolCounters()
    for kind in ("calls", *ERROR_KINDS):  # every failure kind a rollout counts, a new one included
        counters[kind] += 1
    assert {m.kind for m in counters.metrics().values()} == {"sum"}
    # config checks and reward modules import it with torch and transformers refused
    code = "import sys, mmrlvr.metric; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


def test_one_process_is_left_alone():
    m = {"a": Metric.sum(1.0)}
    assert reduce_over_processes(m, 1) is m


_TWO_RANKS = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    dist.init_process_group("gloo")
    from mmrlvr.metric import Metric, reduce_over_processes
    rank = dist.get_rank()
    # different keys and sizes on each rank: packing values into one tensor would abort here
    m = {f"offpolicy/bin{b}/tokens": Metric.sum(b + 1) for b in range(3 + 5 * rank)}
    m.update({"reward/mean": Metric.mean(0.25 + rank, n=4.0 * (1 + 2 * rank)), "ratio/max": Metric.max(1.0 + rank),
              "skipped": Metric.max(0.0), "where": f"rank{rank}"})
    out = reduce_over_processes(m, dist.get_world_size())
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:  # one file per rank (stdout interleaves)
        json.dump({"rank": rank, "world": dist.get_world_size(), "out": out}, f)
    dist.destroy_process_group()
""")


def test_two_gloo_processes_with_different_keys_reduce_without_a_size_mismatch(tmp_path):
    from tests.multiproc import env, torchrun_cmd

    script = tmp_path / "two.py"
    script.write_text(_TWO_RANKS)
    p = subprocess.run(torchrun_cmd(str(script), str(tmp_path)), env=env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    outs = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(o["rank"] for o in outs) == [0, 1] and all(o["world"] == 2 for o in outs)
    assert outs[0]["out"] == outs[1]["out"], "every rank logs the same metrics"
    out = outs[0]["out"]
    assert out["offpolicy/bin7/tokens"] == 8.0 and out["offpolicy/bin0/tokens"] == 2.0  # summed where present
    assert out["reward/mean"] == pytest.approx((0.25 * 4 + 1.25 * 12) / 16)  # row-weighted
    assert out["ratio/max"] == 2.0 and out["where"] == "rank0"
    assert sys.executable  # the child ran this interpreter (torchrun_cmd)
