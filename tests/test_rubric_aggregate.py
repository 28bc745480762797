"""Hand-worked aggregation: rar, hierarchical, unknown exclusion, saturation dropping and the POW3R update."""

from __future__ import annotations

import pytest

from mmrlvr.rubric.aggregate import (
    AGGREGATIONS,
    Pow3rConfig,
    hierarchical,
    pass_rates,
    pow3r_targets,
    pow3r_update,
    rar,
    saturated,
    score_group,
)

E, I, O, P = "essential", "important", "optional", "pitfall"
CATS = [E, I, O, P]
W = [1.0, 0.7, 0.3, 0.9]  # RaR defaults (pitfall magnitude)


class TestRar:
    def test_weighted_mean_with_pitfall_subtracted(self):
        # met: E, O, and the pitfall -> (1.0 + 0.3 - 0.9) / (1.0 + 0.7 + 0.3) = 0.4 / 2.0 = 0.2
        assert rar([1, 0, 1, 1], W, CATS) == pytest.approx(0.2)
        # everything positive met, no pitfall -> 2.0 / 2.0 = 1
        assert rar([1, 1, 1, 0], W, CATS) == pytest.approx(1.0)
        # nothing met, pitfall met -> -0.9 / 2.0 = -0.45 (the lower bound for this rubric)
        assert rar([0, 0, 0, 1], W, CATS) == pytest.approx(-0.45)

    def test_unknown_excluded_from_numerator_and_denominator(self):
        # important unknown: (1.0 + 0.3) / (1.0 + 0.3) = 1.0 - not 1.3/2.0 (unknown as fail), not 2.0/2.0 (as pass)
        assert rar([1, None, 1, 0], W, CATS) == pytest.approx(1.0)
        # failing important unknown changes nothing in the other direction either: 0.3 / 1.3
        assert rar([0, None, 1, None], W, CATS) == pytest.approx(0.3 / 1.3)
        assert rar([None, None, None, None], W, CATS) is None

    def test_pitfall_only_rubric(self):
        # denominator falls back to the pitfall weights: -0.9 / 0.9 = -1
        assert rar([1], [0.9], [P]) == pytest.approx(-1.0)
        assert rar([0], [0.9], [P]) == pytest.approx(0.0)


class TestHierarchical:
    def test_essentials_gate(self):
        # gate passes; s_A = 0.3 / (0.7 + 0.3) = 0.3; base = 0.5 + 0.5 * 0.3 = 0.65;
        # penalty = 0.9 / (1.0 + 0.7 + 0.3) = 0.45 -> 0.65 - 0.45 = 0.2
        assert hierarchical([1, 0, 1, 1], W, CATS) == pytest.approx(0.2)
        # all additional met, no pitfall: 0.5 + 0.5 * 1 = 1
        assert hierarchical([1, 1, 1, 0], W, CATS) == pytest.approx(1.0)
        # essential failed: capped at fail_score 0 whatever the additional criteria say
        assert hierarchical([0, 1, 1, 0], W, CATS) == pytest.approx(0.0)
        # ... and pitfalls still subtract: 0 - 0.45
        assert hierarchical([0, 1, 1, 1], W, CATS) == pytest.approx(-0.45)

    def test_failed_essential_never_made_up_for(self):
        many = [E, E] + [I] * 10
        w = [1.0, 1.0] + [0.7] * 10
        one_fail = hierarchical([1, 0] + [1] * 10, w, many)
        all_pass_no_extras = hierarchical([1, 1] + [0] * 10, w, many)
        assert one_fail == 0.0 and all_pass_no_extras == pytest.approx(0.5)
        # under rar the trade is possible: (1 + 10 * 0.7) / 9 = 0.889 > (2 + 0) / 9 = 0.222
        assert rar([1, 0] + [1] * 10, w, many) > rar([1, 1] + [0] * 10, w, many)

    def test_options_and_no_essentials(self):
        # share 0.8: 0.8 + 0.2 * 0.3 = 0.86; minus 0.45 = 0.41
        assert hierarchical([1, 0, 1, 1], W, CATS, essential_share=0.8) == pytest.approx(0.41)
        assert hierarchical([0, 0, 0, 0], W, CATS, fail_score=-1.0) == pytest.approx(-1.0)
        # no essential criteria: the additional score alone, 0.7 / (0.7 + 0.3) = 0.7
        assert hierarchical([1, 0], [0.7, 0.3], [I, O]) == pytest.approx(0.7)

    def test_unknown_essentials(self):
        # the only essential unknown -> undetermined (cannot gate)
        assert hierarchical([None, 1, 1, 0], W, CATS) is None
        # one of two essentials unknown: gate on the known one; s_A = 1; base 1.0; no pitfall
        assert hierarchical([1, None, 1, 1, 0], [1, 1, 0.7, 0.3, 0.9], [E, E, I, O, P]) == pytest.approx(1.0)


def test_registry():
    assert AGGREGATIONS.names() == ["hierarchical", "rar"]
    with pytest.raises(KeyError, match="known: hierarchical, rar"):
        AGGREGATIONS.get("mean")


class TestSaturation:
    # G = 3 rollouts x J = 3 criteria (E, I, O); E all met, O all failed: both saturated
    VALUES = [[1, 1, 0], [1, 0, 0], [1, 1, 0]]

    def test_detection(self):
        assert saturated(self.VALUES) == [True, False, True]
        # unknowns are ignored; a single known verdict is not enough to call it saturated
        assert saturated([[1, None], [1, 1], [None, None]]) == [True, False]

    def test_rar_drop(self):
        static, _, _ = score_group(self.VALUES, [1.0, 0.7, 0.3], [E, I, O], method="rar")
        # (1 + 0.7) / 2.0 = 0.85; 1.0 / 2.0 = 0.5
        assert static == pytest.approx([0.85, 0.5, 0.85])
        dropped, eff, sat = score_group(self.VALUES, [1.0, 0.7, 0.3], [E, I, O], method="rar", drop_saturated=True)
        # only I keeps its weight: 0.7 / 0.7 = 1, 0 / 0.7 = 0
        assert eff == [0.0, 0.7, 0.0] and sat == [True, False, True]
        assert dropped == pytest.approx([1.0, 0.0, 1.0])

    def test_hierarchical_drop_keeps_the_gate(self):
        # essential saturated at "met": weight dropped, gate still passes; s_A over I only
        scores, _, _ = score_group(self.VALUES, [1.0, 0.7, 0.3], [E, I, O], method="hierarchical", drop_saturated=True)
        assert scores == pytest.approx([1.0, 0.5, 1.0])
        # essential saturated at "failed": still gates every rollout to 0 even though I differs
        failed = [[0, 1], [0, 0]]
        scores, _, _ = score_group(failed, [1.0, 0.7], [E, I], method="hierarchical", drop_saturated=True)
        assert scores == [0.0, 0.0]

    def test_everything_saturated_drops_nothing(self):
        scores, eff, _ = score_group([[1, 0], [1, 0]], [1.0, 0.7], [E, I], method="rar", drop_saturated=True)
        assert eff == [1.0, 0.7] and scores == pytest.approx([1 / 1.7, 1 / 1.7])


class TestPow3r:
    # G = 4; I1 passes 2/4, I2 3/4, the pitfall never happens
    VALUES = [[1, 1, 0], [1, 1, 0], [0, 1, 0], [0, 0, 0]]
    CATS = [I, I, P]

    def test_pass_rates_and_targets(self):
        rates = pass_rates(self.VALUES)
        assert rates == [0.5, 0.75, 0.0]
        # v = p(1-p): 0.25, 0.1875, 0; importants' mean v = 0.21875 -> u = 1.142857, 0.857143
        # target = 0.5 + 0.5 u = 1.0714286, 0.9285714; the pitfall's category mean is 0 -> u = 1 -> 1.0
        assert pow3r_targets(rates, self.CATS, blend=0.5) == pytest.approx([1.0714286, 0.9285714, 1.0])

    def test_ema_update_from_one(self):
        cfg = Pow3rConfig(blend=0.5, ema=0.9)
        targets = pow3r_targets(pass_rates(self.VALUES), self.CATS, cfg.blend)
        # 0.9 * 1 + 0.1 * 1.0714286 = 1.0071429; 0.9 + 0.1 * 0.9285714 = 0.9928571; 0.9 + 0.1 = 1.0
        assert pow3r_update([1.0, 1.0, 1.0], targets, cfg) == pytest.approx([1.0071429, 0.9928571, 1.0])

    def test_repeated_updates_converge_to_the_target_and_clip(self):
        cfg = Pow3rConfig(blend=1.0, ema=0.5, alpha_min=0.25, alpha_max=1.5)
        # blend 1: targets = u = 1.142857, 0.857143; pitfall 1
        a = [1.0, 1.0, 1.0]
        for _ in range(30):
            a = pow3r_update(a, pow3r_targets(pass_rates(self.VALUES), self.CATS, cfg.blend), cfg)
        assert a == pytest.approx([1.142857, 0.857143, 1.0], abs=1e-6)
        # a saturated criterion next to an informative one: u = 0 -> target 0 -> clipped at alpha_min
        sat = [[1, 1], [1, 0], [1, 1], [1, 0]]   # I1 always met (v = 0), I2 half (v = 0.25)
        a = [1.0, 1.0]
        for _ in range(30):
            a = pow3r_update(a, pow3r_targets(pass_rates(sat), [I, I], 1.0), cfg)
        # I2: u = 0.25 / 0.125 = 2 -> clipped at 1.5
        assert a == pytest.approx([0.25, 1.5])

    def test_unknown_rates_leave_alpha(self):
        cfg = Pow3rConfig()
        assert pow3r_targets([None, 0.5], [I, I], 0.5) == [None, 1.0]
        assert pow3r_update([0.7, 1.0], [None, 1.0], cfg) == pytest.approx([0.7, 1.0])

    def test_alphas_scale_weights(self):
        # weights 0.7, 0.7 scaled by alpha 2 and 0.5 -> 1.4, 0.35; rollout meeting only I1: 1.4 / 1.75 = 0.8
        scores, eff, _ = score_group([[1, 0]], [0.7, 0.7], [I, I], method="rar", alphas=[2.0, 0.5])
        assert eff == pytest.approx([1.4, 0.35]) and scores == pytest.approx([0.8])

    def test_config_validation(self):
        with pytest.raises(ValueError):
            Pow3rConfig(ema=1.0)
        with pytest.raises(ValueError):
            Pow3rConfig(alpha_min=1.5)
