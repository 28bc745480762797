"""Credit schemes on hand-worked tensors: normalisation, top-k counting and ties, the VEPO score, VPPO's
advantage scaling, PAPO's loss term, RSI's band, the shared statistics, and masking."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.credit import (CREDIT_SCHEMES, TokenSignals, build_scheme, minmax_per_row, selection_stats,
                           topk_count, topk_per_row, vepo_score, vppo_advantage_scale)
from mmrlvr.errors import UserError


def _signals(entropy, jsd=None, shift=None, logp=None, logq=None, old_logp=None) -> TokenSignals:
    entropy = torch.as_tensor(entropy, dtype=torch.float32)
    z = torch.zeros_like(entropy)
    t = lambda x: None if x is None else torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    return TokenSignals(entropy=entropy, jsd=t(jsd), entropy_shift=t(shift),
                        logp=t(logp) if logp is not None else z,
                        logq=t(logq) if logq is not None else (None if jsd is None else z), old_logp=t(old_logp))


def test_minmax_per_row():
    x = torch.tensor([[1.0, 3.0, 2.0, 99.0], [5.0, 5.0, 5.0, 0.0], [1e-9, 3e-9, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    out = minmax_per_row(x, mask)
    # row 0: (x - 1)/(3 - 1) = [0, 1, .5]; the masked 99 is ignored and -> 0
    torch.testing.assert_close(out[0], torch.tensor([0.0, 1.0, 0.5, 0.0]))
    # row 1: valid values 5, 5, 5, 0 -> span 5: [1, 1, 1, 0]
    torch.testing.assert_close(out[1], torch.tensor([1.0, 1.0, 1.0, 0.0]))
    # row 2: span 3e-9 is below atol (rounding noise), so the row counts as constant -> 0
    assert bool((out[2] == 0).all())


def test_topk_count_uses_ceil_without_float_creep():
    mask = torch.zeros(4, 16)
    for i, t in enumerate([15, 16, 1, 0]):
        mask[i, :t] = 1
    # 0.2*15 = 3.0000000000000004 in floats, but ceil must give 3; 0.2*16 = 3.2 -> 4; 0.2*1 -> 1; 0 -> 0
    assert topk_count(mask, 0.2).tolist() == [3, 4, 1, 0]
    assert topk_count(mask, 0.4).tolist() == [6, 7, 1, 0]  # 0.4*15 = 6, 0.4*16 = 6.4 -> 7


def test_topk_ties_and_masking():
    score = torch.tensor([[1.0, 1.0, 0.0, 1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the 9.0 is masked: never selected
    k = torch.tensor([2])
    # ties among positions 0, 1, 3 (score 1): earlier positions first -> {0, 1}
    assert topk_per_row(score, mask, k).tolist() == [[True, True, False, False, False]]
    # with a tie-break of [0, 1, 5, 2, 0]: among 0, 1, 3 the highest tie-breaks are 3 (2) and 1 (1)
    tb = torch.tensor([[0.0, 1.0, 5.0, 2.0, 0.0]])
    assert topk_per_row(score, mask, k, tiebreak=tb).tolist() == [[False, True, False, True, False]]


def test_vepo_score_hand_worked():
    # one response, 4 valid tokens (alpha = 0.7)
    # jsd [0, .2, .4, .1]   -> j = [0, .5, 1, .25]
    # entropy [1, 2, 3, 2.5] -> h = [0, .5, 1, .75]
    # |shift| [.1, .3, .2, .25] -> g = [0, 1, .5, .75]
    # t0: [1 - 1^.7 * 1^.3] * 0 = 0
    # t1: (1-.5)^.7 * (1-1)^.3 = 0 -> [1 - 0] * .5 = .5
    # t2: (1-1)^.7 = 0 -> 1 * 1 = 1
    # t3: .75^.7 * .25^.3 = exp(.7 ln .75 + .3 ln .25) = exp(-.2013775 - .4158883) = .5394173
    #     -> (1 - .5394173) * .75 = .3454370
    jsd = torch.tensor([[0.0, 0.2, 0.4, 0.1]])
    ent = torch.tensor([[1.0, 2.0, 3.0, 2.5]])
    shift = torch.tensor([[0.1, -0.3, 0.2, -0.25]])
    mask = torch.ones(1, 4)
    s = vepo_score(jsd, ent, shift, mask, alpha=0.7)
    torch.testing.assert_close(s, torch.tensor([[0.0, 0.5, 1.0, 0.3454370]]), atol=1e-6, rtol=0)
    sig = _signals(ent, jsd, shift)
    # rho = .2: k = ceil(.8) = 1 -> t2;  rho = .5: k = 2 -> t2, t1
    assert CREDIT_SCHEMES.get("vepo")(sig, mask, torch.zeros(1)).selected.tolist() == [[False, False, True, False]]
    r = CREDIT_SCHEMES.get("vepo")(sig, mask, torch.zeros(1), rho=0.5)
    assert r.selected.tolist() == [[False, True, True, False]]
    torch.testing.assert_close(r.token_weights, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
    # weight mode: w = 1 + .5 * selected on every valid token
    w = build_scheme("vepo", rho=0.5, mode="weight")(sig, mask, torch.zeros(1)).token_weights
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 1.5, 1.0]]))


def test_vepo_without_visual_signal_is_entropy_ranking():
    g = torch.Generator().manual_seed(0)
    ent = torch.rand(6, 20, generator=g)
    mask = (torch.rand(6, 20, generator=g) > 0.2).float()
    sig = _signals(ent * mask, torch.zeros(6, 20), torch.zeros(6, 20))
    vepo = CREDIT_SCHEMES.get("vepo")(sig, mask, torch.zeros(6))
    topk = CREDIT_SCHEMES.get("entropy_topk")(sig, mask, torch.zeros(6))
    assert torch.equal(vepo.selected, topk.selected)
    assert vepo.stats["credit/entropy_topk_jaccard"] == 1.0
    assert vepo.stats["credit/vision_sensitivity_mean"] == 0.0


def test_vppo_advantage_scale_hand_worked():
    # mean dependency per response S̄ = [0, .5, 1] (the 4th response has no valid token -> scale 1)
    # n = [0, .5, 1], mean n = .5, beta_max = .9 + .1/.5 = 1.1, scale = .9 + n * .2 = [.9, 1.0, 1.1]
    dep = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    torch.testing.assert_close(vppo_advantage_scale(dep, mask, 0.9), torch.tensor([0.9, 1.0, 1.1, 1.0]))
    # S̄ = [1, 1, 4]: n = [0, 0, 1], mean n = 1/3, beta_max = .9 + .1*3 = 1.2 -> [.9, .9, 1.2] (mean 1)
    dep = torch.tensor([[1.0], [1.0], [4.0]])
    torch.testing.assert_close(vppo_advantage_scale(dep, torch.ones(3, 1), 0.9), torch.tensor([0.9, 0.9, 1.2]))
    # all equal: no signal -> every scale 1
    torch.testing.assert_close(vppo_advantage_scale(torch.ones(3, 2), torch.ones(3, 2)), torch.ones(3))


def test_vppo_scheme_end_to_end():
    # S_t from d = logq - old:  row 0: d = [1, 0, 0] -> S = [.7182818, 0, 0], mean .2394273
    #                           row 1: d = [0, 0, 0] -> S = 0, mean 0
    # k = .4: ceil(1.2) = 2 tokens per row; row 0 -> t0 then (tie at 0) the higher entropy of t1/t2
    # scale: n = [1, 0], mean .5, beta_max = 1.1 -> [1.1, .9]
    old = torch.tensor([[-2.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    logq = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ent = torch.tensor([[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]])
    sig = _signals(ent, torch.zeros(2, 3), torch.zeros(2, 3), logp=old, logq=logq)
    r = CREDIT_SCHEMES.get("vppo")(sig, torch.ones(2, 3), torch.tensor([1.0, -1.0]))
    assert r.selected.tolist() == [[True, False, True], [True, True, False]]
    torch.testing.assert_close(r.adv_scale, torch.tensor([1.1, 0.9]))
    torch.testing.assert_close(float(r.stats["credit/dependency_mean"]), 0.7182818 / 6, atol=1e-6, rtol=0)
    # old_logprobs given explicitly wins over signals.logp / old_logp
    r2 = CREDIT_SCHEMES.get("vppo")(sig._replace(logp=logq), torch.ones(2, 3), torch.zeros(2), old_logprobs=old)
    torch.testing.assert_close(r2.adv_scale, r.adv_scale)


def test_papo_extra_loss_term():
    # logp = -1, logq = -2: k3 = e^-1 = .3678794 -> term = -.02 * .3678794 = -.0073576
    # d term / d logp = -.02 * (1 - e^-1) = -.0126424; masked token: 0 and no gradient
    sig = _signals([[1.0, 1.0]], [[0.1, 0.1]], [[0.0, 0.0]], logp=[[-1.0, -1.0]], logq=[[-2.0, -2.0]])
    mask = torch.tensor([[1.0, 0.0]])
    r = CREDIT_SCHEMES.get("papo")(sig, mask, torch.zeros(1))
    torch.testing.assert_close(r.token_weights, mask)
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    term = r.extra_loss(logp)
    torch.testing.assert_close(term.detach(), torch.tensor([[-0.0073576, 0.0]]), atol=1e-7, rtol=0)
    term.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.0126424, 0.0]]), atol=1e-7, rtol=0)
    torch.testing.assert_close(float(r.stats["credit/perception_kl"]), 0.3678794, atol=1e-6, rtol=0)


def test_rsi_band():
    # RSI = -logp / H = [.5/1, 2/1, .1/.5] = [.5, 2, .2];  normalised entropy h~ = [1, 1, 0]
    # adapt 0: band [.5, 2] -> keep t0, t1 (bounds inclusive), drop t2
    # adapt 1: t2's band widens by 1 - h~ = 1 -> [.5*0, 2*2] = [0, 4] -> keep t2 as well
    sig = _signals([[1.0, 1.0, 0.5]], logp=[[-0.5, -2.0, -0.1]])
    mask = torch.ones(1, 3)
    assert CREDIT_SCHEMES.get("rsi")(sig, mask, torch.zeros(1), adapt=0.0).selected.tolist() == [[True, True, False]]
    assert CREDIT_SCHEMES.get("rsi")(sig, mask, torch.zeros(1)).selected.tolist() == [[True, True, True]]


def test_selection_stats_hand_worked():
    # one response of 4 tokens, entropy [4, 1, 3, 2]; median (torch's lower median) 2 -> below: t1 only
    # selected = {t1, t2}: fraction 2/4; low-entropy share 1/2
    # entropy top-20%: k = ceil(.8) = 1 -> {t0};  Jaccard({t1, t2}, {t0}) = 0/3 = 0
    sig = _signals([[4.0, 1.0, 3.0, 2.0]], jsd=[[0.1, 0.3, 0.2, 0.0]], shift=[[0.0] * 4])
    sel = torch.tensor([[False, True, True, False]])
    st = selection_stats(sel, sig, torch.ones(1, 4))
    assert st["credit/selected_fraction"] == 0.5
    assert st["credit/selected_low_entropy_share"] == 0.5
    assert st["credit/entropy_topk_jaccard"] == 0.0
    torch.testing.assert_close(float(st["credit/vision_sensitivity_mean"]), 0.15, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["none", "entropy_topk", "vepo", "vppo", "papo", "rsi"])
def test_masked_tokens_never_selected_or_weighted(name):
    g = torch.Generator().manual_seed(1)
    N, L = 5, 12
    mask = (torch.rand(N, L, generator=g) > 0.4).float()
    big = (1 - mask) * 100.0  # masked tokens carry the most extreme signals
    sig = _signals(torch.rand(N, L, generator=g) + big, torch.rand(N, L, generator=g) * 0.5 + big,
                   torch.randn(N, L, generator=g) + big, logp=-torch.rand(N, L, generator=g) * 3,
                   logq=-torch.rand(N, L, generator=g) * 3 + big)
    r = CREDIT_SCHEMES.get(name)(sig, mask, torch.randn(N, generator=g))
    assert not bool((r.selected & (mask == 0)).any())
    assert bool((r.token_weights[mask == 0] == 0).all())
    assert r.token_weights.shape == (N, L) and r.adv_scale.shape == (N,)
    assert 0.0 <= r.stats["credit/selected_fraction"] <= 1.0


def test_registry_flags_and_errors():
    assert CREDIT_SCHEMES.names() == ["delta", "entropy_topk", "none", "papo", "rsi", "vepo", "vppo"]
    needs = {n: CREDIT_SCHEMES.get(n).needs_perturbed for n in CREDIT_SCHEMES}
    assert needs == {"delta": False, "entropy_topk": False, "none": False, "papo": True, "rsi": False, "vepo": True,
                     "vppo": True}
    assert [n for n in CREDIT_SCHEMES if CREDIT_SCHEMES.get(n).needs_distribution] == ["vepo"]
    # VPPO and PAPO work from logq alone (distribution=False signals: no JSD)
    cheap = TokenSignals(entropy=torch.ones(1, 2), jsd=None, entropy_shift=None, logp=-torch.ones(1, 2),
                         logq=-torch.ones(1, 2))
    for name in ("vppo", "papo"):
        r = CREDIT_SCHEMES.get(name)(cheap, torch.ones(1, 2), torch.zeros(1))
        assert "credit/vision_sensitivity_mean" not in r.stats
    with pytest.raises(UserError, match="distribution=True"):
        CREDIT_SCHEMES.get("vepo")(cheap, torch.ones(1, 2), torch.zeros(1))
    with pytest.raises(UserError, match="known"):
        build_scheme("vepo", top_ratio=0.2)
    with pytest.raises(UserError, match="mode"):
        build_scheme("vepo", mode="soft")
    with pytest.raises(UserError, match="perturbed"):
        CREDIT_SCHEMES.get("vepo")(_signals([[1.0]]), torch.ones(1, 1), torch.zeros(1))
    with pytest.raises(KeyError, match="known"):
        CREDIT_SCHEMES.get("vepo2")
