"""DAPO extras (dynamic sampling, refill, overlong shaping, truncation mask) and algorithm presets."""

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.algos import (
    ADVANTAGES,
    AGG_MODES,
    KL_ESTIMATORS,
    PRESETS,
    agg_loss,
    call_policy_loss,
    dynamic_sampling_filter,
    get_preset,
    overlong_penalty,
    refill,
    truncation_mask,
)
from mmrlvr.errors import UserError


class TestDynamicSampling:
    def test_drops_groups_with_equal_rewards(self):
        # group 0 (1,1,0,1) has spread; group 1 (0,0,0) none; the lone row of group 7 none
        rewards = torch.tensor([1.0, 1, 0, 1, 0, 0, 0, 1])
        groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 7])
        keep_groups = dynamic_sampling_filter(rewards, groups, accuracy=rewards)
        # indexed by label 0..7: labels 2..6 have no rows -> False
        assert keep_groups.tolist() == [True] + [False] * 7
        assert keep_groups[groups].tolist() == [True] * 4 + [False] * 4  # the row mask

    def test_negative_labels_rejected(self):
        with pytest.raises(ValueError, match=">= 0"):
            dynamic_sampling_filter(torch.tensor([1.0, 0.0]), torch.tensor([-1, -1]), metric="reward")

    def test_empty_batch(self):
        assert dynamic_sampling_filter(torch.zeros(0), torch.zeros(0, dtype=torch.long), metric="reward").shape == (0,)

    def test_refill_until_target(self):
        batch, buffer = refill([], ["g1"], target=3)
        assert batch is None and buffer == ["g1"]
        batch, buffer = refill(buffer, ["g2"], target=3)
        assert batch is None and buffer == ["g1", "g2"]
        batch, buffer = refill(buffer, ["g3", "g4", "g5"], target=3)
        assert batch == ["g1", "g2", "g3"] and buffer == []  # surplus discarded, as DAPO does

    def test_refill_keep_leftover(self):
        batch, buffer = refill(["a"], ["b", "c", "d"], target=2, keep_leftover=True)
        assert batch == ["a", "b"] and buffer == ["c", "d"]

    def test_refill_bad_target(self):
        with pytest.raises(ValueError, match="target"):
            refill([], [], target=0)


class TestOverlong:
    def test_hand_worked(self):
        # L_max 20, L_cache 5 -> zone starts at 15: len 10 -> 0; 15 -> 0; 16 -> -1/5; 18 -> -3/5;
        # 20 -> -5/5 = -1; 21 (beyond the limit) -> -1
        lengths = torch.tensor([10, 15, 16, 18, 20, 21])
        assert_close(overlong_penalty(lengths, max_len=20, cache_len=5),
                     torch.tensor([0.0, 0.0, -0.2, -0.6, -1.0, -1.0]))
        assert_close(overlong_penalty(lengths, max_len=20, cache_len=5, penalty=0.5),
                     torch.tensor([0.0, 0.0, -0.1, -0.3, -0.5, -0.5]))

    def test_no_cache_only_punishes_beyond_the_limit(self):
        assert_close(overlong_penalty(torch.tensor([20, 21]), max_len=20, cache_len=0), torch.tensor([0.0, -1.0]))

    def test_bad_cache(self):
        with pytest.raises(ValueError, match="cache_len"):
            overlong_penalty(torch.tensor([1]), max_len=10, cache_len=11)


class TestTruncationMask:
    def test_bool_tensor(self):
        assert_close(truncation_mask(torch.tensor([False, True, False])), torch.tensor([1.0, 0.0, 1.0]))

    def test_finish_reasons(self):
        assert_close(truncation_mask(["stop", "length", "stop"]), torch.tensor([1.0, 0.0, 1.0]))

    def test_masked_rows_drop_out_of_the_loss(self):
        # row 1 truncated: token-mean over row 0 only = (1 + 2) / 2
        loss = torch.tensor([[1.0, 2.0], [10.0, 20.0]])
        mask = torch.ones(2, 2) * truncation_mask(["stop", "length"])[:, None]
        assert_close(agg_loss(loss, mask, "token-mean"), torch.tensor(1.5))


class TestPresets:
    @pytest.mark.parametrize("name", sorted(PRESETS))
    def test_every_preset_names_registered_parts_and_runs(self, name):
        p = get_preset(name)
        assert p["advantage"] in ADVANTAGES and p["agg_mode"] in AGG_MODES
        assert p["kl_estimator"] in KL_ESTIMATORS
        rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long)
        adv = ADVANTAGES.get(p["advantage"])(rewards, groups, **p["advantage_params"])
        old = torch.full((4, 3), -1.0)
        logp = (old + 0.01).requires_grad_(True)
        loss, _ = call_policy_loss(p["loss"], logp, old, adv, torch.ones(4, 3), **p["loss_params"])
        total = agg_loss(loss, torch.ones(4, 3), p["agg_mode"])
        (grad,) = torch.autograd.grad(total, logp)
        assert torch.isfinite(total) and grad.abs().sum() > 0

    def test_method_settings(self):
        assert PRESETS["dapo"]["loss_params"]["eps_high"] == 0.28 and PRESETS["dapo"]["dynamic_sampling"]
        assert PRESETS["dapo"]["agg_mode"] == "token-mean" and PRESETS["dapo"]["kl_coef"] == 0.0
        assert PRESETS["grpo"]["agg_mode"] == "seq-mean-token-mean" and PRESETS["grpo"]["kl_coef"] == 0.04
        assert PRESETS["dr_grpo"]["advantage"] == "dr_grpo"
        assert PRESETS["dr_grpo"]["agg_mode"] == "seq-mean-token-sum-norm"
        assert PRESETS["gspo"]["loss"] == "gspo" and PRESETS["cispo"]["loss"] == "cispo"

    def test_get_preset_is_a_copy(self):
        p = get_preset("dapo")
        p["loss_params"]["eps_high"] = 0.5
        assert PRESETS["dapo"]["loss_params"]["eps_high"] == 0.28

    def test_unknown_preset(self):
        with pytest.raises(UserError, match="unknown algorithm preset 'ppo'; known: cispo, dapo, dr_grpo, grpo, gspo"):
            get_preset("ppo")
