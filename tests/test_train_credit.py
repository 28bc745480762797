"""Credit inside the update (credit.in_update) gives the same step as a separate clean pass.

The deferred path takes the clean distribution from the policy's own first forward and normalises the
loss after the fact; a separate no-grad clean pass computes the same credit before the update. Both must
give the same token weights, credit metrics and parameters after a step, on the real tiny Qwen2.5-VL,
with two micro-batches (so the after-the-fact normaliser really spans micro-batches).
"""

from __future__ import annotations

import pytest
import torch

from mmrlvr.config import load_config
from tests.test_train_loop import small_config, tiny_dir  # noqa: F401  (fixture)


def _deferred(trainer) -> bool:
    """Whether the run's credit stage is the one inside the update's first pass."""
    return trainer.pipeline.names["credit"] == ["in_update"]


def _one_step(tiny_dir, out, scheme: str, in_update: bool, agg: str, epochs: int = 1):
    from mmrlvr.train.trainer import Trainer

    cfg = small_config(tiny_dir, out, max_steps=1, credit__scheme=scheme, credit__in_update=in_update,
                       algo__agg=agg, algo__epochs=epochs, credit__perturbation="patch_blackout",
                       log_rollouts=False)
    trainer = Trainer(load_config(data=cfg))
    # keep each optimizer step's gradients: Adam's first step (~lr * sign(g)) would turn 1e-12 rounding
    # differences of near-zero gradients into lr-sized parameter differences, so gradients are compared
    trainer.grads = []
    upd = trainer.pipeline.stage("update")
    step = upd.optimizer_step

    def keep_grads():
        trainer.grads.append({n: p.grad.detach().clone() for n, p in trainer.policy.named_parameters()
                              if p.grad is not None})
        return step()

    upd.optimizer_step = keep_grads
    data = trainer.pipeline.run(0, upto="credit")  # generate .. credit, then the update on its own
    stats = upd.update(data)
    return trainer, data, stats


def _same_grads(a, b, atol: float) -> None:
    assert len(a.grads) == len(b.grads) > 0
    for ga, gb in zip(a.grads, b.grads):
        assert ga.keys() == gb.keys()
        for n in ga:
            assert torch.allclose(ga[n], gb[n], atol=atol, rtol=1e-4), n


@pytest.mark.parametrize("scheme, agg", [("vepo", "token-mean"), ("vepo", "seq-mean-token-mean"),
                                         ("entropy_topk", "token-mean")])
def test_in_update_credit_equals_a_separate_pass(tiny_dir, tmp_path, scheme, agg):
    t_sep, d_sep, s_sep = _one_step(tiny_dir, tmp_path / "sep", scheme, False, agg)
    t_in, d_in, s_in = _one_step(tiny_dir, tmp_path / "in", scheme, True, agg)
    assert _deferred(t_in) and not _deferred(t_sep)
    assert d_in.deferred is not None and d_in.deferred.done
    # same credit: weights (selection), signals and metrics
    assert torch.equal(d_sep.token_weights > 0, d_in.token_weights > 0)
    assert torch.allclose(d_sep.token_weights, d_in.token_weights, atol=1e-6)
    assert 0 < float((d_in.token_weights > 0).sum()) < float(d_in.batch.response_mask.sum())
    assert torch.allclose(d_sep.signals.entropy, d_in.signals.entropy, atol=1e-4)
    if scheme == "vepo":
        assert torch.allclose(d_sep.signals.jsd, d_in.signals.jsd, atol=1e-5)
        assert float(d_in.signals.jsd.max()) > 1e-4  # the perturbation really moved the distribution
    assert d_sep.credit_stats.keys() == d_in.credit_stats.keys()
    for k, v in d_sep.credit_stats.items():
        assert d_in.credit_stats[k] == pytest.approx(v, abs=1e-5), k
    # same gradient step
    assert s_in["loss"] == pytest.approx(s_sep["loss"], abs=1e-6)
    assert s_in["grad_norm"] == pytest.approx(s_sep["grad_norm"], rel=1e-4)
    _same_grads(t_sep, t_in, atol=1e-7)


def test_vppo_is_not_deferred(tiny_dir, tmp_path):
    """VPPO's advantage scale is min-max normalised over the whole batch: it cannot be done per micro-batch."""
    t, d, _ = _one_step(tiny_dir, tmp_path / "v", "vppo", True, "token-mean")
    assert not _deferred(t) and d.deferred is None and d.signals is not None


def test_second_epoch_reuses_the_first_pass_credit(tiny_dir, tmp_path):
    t_sep, d_sep, s_sep = _one_step(tiny_dir, tmp_path / "sep", "vepo", False, "token-mean", epochs=2)
    t_in, d_in, s_in = _one_step(tiny_dir, tmp_path / "in", "vepo", True, "token-mean", epochs=2)
    assert torch.allclose(d_sep.token_weights, d_in.token_weights, atol=1e-6)
    _same_grads(t_sep, t_in, atol=1e-6)  # both epochs


def test_only_schemes_that_declare_row_local_credit_are_deferred():
    from dataclasses import dataclass

    from mmrlvr.credit import CREDIT_SCHEMES, CreditScheme
    from mmrlvr.train.deferred_credit import can_defer

    assert {n for n in ("none", "entropy_topk", "vepo", "vppo", "papo", "rsi") if can_defer(CREDIT_SCHEMES.get(n))} \
        == {"none", "entropy_topk", "vepo", "rsi"}  # papo reads only the perturbed pass, vppo is batch-wide

    @dataclass
    class PluginScheme(CreditScheme):  # a user's scheme that reads the clean distribution
        def _apply(self, signals, mask, advantages, old_logprobs):
            return self._result(mask > 0, mask, signals, mask)

    assert not can_defer(PluginScheme())  # unknown batch dependence: the safe, separate pass


def test_in_update_credit_reaches_the_rollout_records_and_metrics(tiny_dir, tmp_path):
    from mmrlvr.store.reader import RolloutReader
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    cfg = small_config(tiny_dir, tmp_path / "run", max_steps=1, credit__scheme="vepo",
                       credit__perturbation="patch_blackout")
    trainer = Trainer(load_config(data=cfg))
    assert _deferred(trainer)
    trainer.train()
    rec = RolloutReader(tmp_path / "run").read_step(1)
    for r in rec:
        n = len(r.response_token_ids)
        assert len(r.token_entropy) == len(r.token_vision_sensitivity) == len(r.token_credit_weight) == n
    assert any(max(r.token_vision_sensitivity) > 0 for r in rec)
    kept = sum(sum(w > 0 for w in r.token_credit_weight) for r in rec)
    assert 0 < kept < sum(len(r.response_token_ids) for r in rec)
    row = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r][0]
    assert 0.2 <= row["credit/selected_fraction"] < 0.5 and row["credit/vision_sensitivity_mean"] > 0
    assert "credit/selected_low_entropy_share" in row and "credit/entropy_topk_jaccard" in row


def test_in_update_credit_reads_the_fused_prefix_shared_pass(tiny_dir, tmp_path, monkeypatch):
    """The update's pass never forms [n, L, V] logits for deferred credit: the signals come from the fused head's
    chunks, with each group's prompt run once — and the step equals a separate clean pass."""
    import mmrlvr.train.forward as forward

    shared = []
    real_shared = forward.prefix_shared_logprobs

    def spy(*args, **kwargs):
        out = real_shared(*args, **kwargs)
        shared.append(out is not None and torch.is_grad_enabled() and kwargs.get("observe") is not None)
        return out

    def no_logits(*args, **kwargs):
        raise AssertionError("the update formed full logits")

    t_sep, d_sep, s_sep = _one_step(tiny_dir, tmp_path / "sep", "vepo", False, "token-mean")
    monkeypatch.setattr(forward, "prefix_shared_logprobs", spy)
    monkeypatch.setattr(forward, "response_logits", no_logits)
    t_in, d_in, s_in = _one_step(tiny_dir, tmp_path / "in", "vepo", True, "token-mean")
    assert _deferred(t_in) and any(shared)  # the policy pass with the credit observer ran prefix-shared
    assert torch.equal(d_sep.token_weights > 0, d_in.token_weights > 0)
    assert torch.allclose(d_sep.signals.jsd, d_in.signals.jsd, atol=1e-5)
    assert torch.allclose(d_sep.signals.entropy, d_in.signals.entropy, atol=1e-5)
    assert s_in["loss"] == pytest.approx(s_sep["loss"], abs=1e-6)
    _same_grads(t_sep, t_in, atol=1e-7)


def test_signals_beside_the_fused_head_equal_token_signals_at_a_real_vocabulary():
    """At Qwen's 151,936-token vocabulary and the 3B model's width (2,048), the signals computed inside the fused
    head's log-prob pass equal ``token_signals`` over the whole logits within 1e-5, masked positions 0."""
    from mmrlvr.algos.logits import logprobs_from_hidden
    from mmrlvr.credit.signals import Hidden, SignalsBeside, token_signals

    V, H, n, L = 151_936, 2_048, 2, 24
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.02)
    p_states = torch.randn(n, L, H, generator=g)
    q_states = p_states + 0.3 * torch.randn(n, L, H, generator=g)
    q_states[0, :4] = p_states[0, :4]  # identical positions: JSD exactly 0
    ids = torch.randint(0, V, (n, L), generator=g)
    mask = torch.ones(n, L)
    mask[1, 17:] = 0
    with torch.no_grad():
        want = token_signals(head(p_states), Hidden(q_states, head), ids, mask, temperature=0.9)
    beside = SignalsBeside(Hidden(q_states, head), ids, mask, temperature=0.9)
    hidden = p_states.clone().requires_grad_(True)
    logp, _ = logprobs_from_hidden(hidden, head.weight, ids, temperature=0.9, observe=beside)
    got = beside.signals()
    logp.sum().backward()  # the observer does not disturb the gradient path
    assert hidden.grad is not None and bool(torch.isfinite(hidden.grad).all())
    for name in ("entropy", "jsd", "entropy_shift", "logp", "logq"):
        a, b = getattr(want, name), getattr(got, name)
        # entropies here are ~11.9 nats (log V): their float32 sums over 151,936 terms round at ~1e-6 of that
        tol = 1e-5 if name in ("jsd", "logp", "logq") else 2e-6 * float(want.entropy.abs().max())
        assert float((a - b).abs().max()) <= tol, (name, float((a - b).abs().max()))
        assert bool((b[1, 17:] == 0).all())
    assert bool((got.jsd[0, :4] == 0).all()) and float(got.jsd.max()) > 1e-3
    assert torch.allclose(logp.detach() * mask, got.logp, atol=1e-5)
