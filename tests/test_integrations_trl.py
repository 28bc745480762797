"""mmrlvr rewards as TRL reward functions: called the way GRPOTrainer calls them, then inside a real GRPOTrainer.

TRL 1.16 (``trl/trainer/grpo_trainer.py``, ``_calculate_rewards``) calls each reward function as
``reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs)``
where ``reward_kwargs`` maps every dataset column except ``prompt``/``completion``/``completion_ids`` to a
list (one value per completion) and adds ``trainer_state``, ``log_extra`` and ``log_metric``. Conversational
prompts arrive with the images injected into the user message (``{"type": "image", "image": <PIL>}``) and
completions as ``[{"role": "assistant", "content": text}]``. The unit tests below build exactly that.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from PIL import Image

from mmrlvr.errors import UserError
from mmrlvr.integrations.trl import TRLReward, completion_text, seen_size, trl_reward, trl_rewards
from mmrlvr.rubric.synth import rubric_rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"


def conv_prompt(question: str, image: Image.Image | None = None) -> list[dict]:
    """A conversational prompt as TRL hands it to reward functions (image injected by TRL)."""
    content = ([{"type": "image", "image": image}] if image is not None else []) + [{"type": "text", "text": question}]
    return [{"role": "user", "content": content}]


def conv(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


class Log:
    """Stands in for TRL's ``log_metric`` bound method: records name -> values."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def __call__(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)


@pytest.fixture(scope="module")
def scene():
    """One counting scene with its instance rubric: 3 red shapes, nothing else (yellow/green/blue absent)."""
    row = rubric_rows(1)[0]
    assert row["answer"] == "3" and row["meta"]["counts"] == {"red": 3}
    return row


# ------------------------------------------------------------------------------------------ unit tests

class TestCallingConvention:
    def test_name_is_the_reward_or_label(self):
        assert trl_reward("auto_accuracy").__name__ == "auto_accuracy"
        assert TRLReward("auto_accuracy", label="acc_strict").__name__ == "acc_strict"

    def test_accuracy_conversational_and_weighted(self, scene):
        reward = trl_reward("auto_accuracy", weight=0.5)
        image = scene["images"][0]
        out = reward(prompts=[conv_prompt("How many red shapes are there?", image)] * 2,
                     completions=[conv("<think>I see 3 red.</think><answer>3</answer>"),
                                  conv("<think>I see 2 red.</think><answer>2</answer>")],
                     completion_ids=[[1, 2], [3]], answer=["3", "3"], answer_type=["number", "number"],
                     trainer_state=None, log_extra=lambda *a: None, log_metric=Log())
        assert out == [0.5, 0.0]  # weight 0.5 x (right, wrong)
        batch = reward.last_batch
        assert batch.samples[0].images[0].size == image.size  # the injected image reached the Sample
        assert batch.samples[0].messages[0]["content"][0] == {"type": "image"}  # payload dropped from messages
        assert batch.completions[0].token_ids == [1, 2]

    def test_plain_string_prompts_and_numbers_as_answers(self):
        reward = trl_reward("auto_accuracy", default_answer_type="number")
        assert reward(prompts=["How many?"], completions=["<answer>4</answer>"], answer=[4]) == [1.0]

    def test_choice_options_column_turns_text_answers_into_letters(self):
        reward = trl_reward("auto_accuracy")
        out = reward(prompts=["Which colour?"] * 2, completions=["<answer>B</answer>", "<answer>A</answer>"],
                     answer=["blue", "blue"], answer_type=["choice"] * 2, options=[json.dumps(["red", "blue"])] * 2)
        assert out == [1.0, 0.0]  # "blue" is option B

    def test_completion_text_joins_assistant_turns(self):
        assert completion_text("x") == "x"
        assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}]},
                                {"role": "tool", "content": "t"}, {"role": "assistant", "content": "b"}]) == "a\nb"

    def test_missing_answer_column_names_the_columns(self):
        with pytest.raises(UserError, match=r"no 'answer' column.*\['solution'\]"):
            trl_reward("auto_accuracy")(prompts=["q"], completions=["<answer>1</answer>"], solution=["1"])

    def test_unknown_reward_lists_known_names(self):
        with pytest.raises(UserError, match="unknown reward 'acuracy'; known: .*auto_accuracy.*consistency.*rubric"):
            trl_reward("acuracy")

    def test_bad_params_are_a_user_error(self):
        with pytest.raises(UserError, match=r"bad parameters \['colour'\] for reward 'consistency'"):
            trl_reward("consistency", colour="red")
        with pytest.raises(UserError, match="unknown variant 'sometimes'"):
            trl_reward("consistency", variant="sometimes")

    def test_duplicate_names_need_labels(self):
        with pytest.raises(UserError, match="listed twice"):
            trl_rewards([{"name": "format"}, {"name": "format", "weight": 0.5}])
        two = trl_rewards([{"name": "format"}, {"name": "format", "label": "format2", "weight": 0.5}])
        assert [r.__name__ for r in two] == ["format", "format2"]


class TestRubric:
    def test_instance_rubric_from_json_column(self, scene):
        """RaR on the synthetic rubric: essential 1.0, two important 0.7, optional 0.3, pitfall -0.9.

        reference response: every positive criterion met, pitfall not -> (1 + 0.7 + 0.7 + 0.3) / 2.7 = 1.0;
        "I see 1 yellow", answer 0: only the pitfall (yellow is absent) -> -0.9 / 2.7 = -0.333.
        """
        reward = trl_reward("rubric", group_size=2)
        log = Log()
        out = reward(prompts=[conv_prompt(scene["problem"], scene["images"][0])] * 2,
                     completions=[conv(scene["solution"]), conv("<think>I see 1 yellow.</think><answer>0</answer>")],
                     answer=["3", "3"], rubric=[json.dumps(scene["rubric"])] * 2, log_metric=log)
        assert out == pytest.approx([1.0, -0.9 / 2.7])
        # per-criterion pass rates over the 2 rollouts: count met once -> 0.5; pitfall made once -> 0.5
        assert log.values["rewards/rubric/crit/count"] == [0.5]
        assert log.values["rewards/rubric/crit/absent_colour"] == [0.5]
        assert log.values["judge/unknown_rate"] == [0.0]


class TestGroups:
    """GRPO-CARE bonus (rule judge): among accurate rollouts (acc > 0.1 and >= group mean), 0.5 x acc when
    p >= mean_accurate(p) - 0.01. Group [right+consistent, wrong] -> [0.5, 0]."""

    right, wrong = "<think>I count 2.</think><answer>2</answer>", "<think>I count 1.</think><answer>1</answer>"

    def call(self, reward, questions, completions, answers):
        return reward(prompts=[conv_prompt(q) for q in questions], completions=[conv(c) for c in completions],
                      answer=answers, answer_type=["number"] * len(answers))

    def test_care_bonus_per_group(self):
        reward = trl_reward("consistency", variant="care", judge="rule", group_size=2)
        out = self.call(reward, ["qa", "qa", "qb", "qb"], [self.right, self.wrong, self.wrong, self.wrong],
                        ["2", "2", "2", "2"])
        assert out == [0.5, 0.0, 0.0, 0.0]  # group qb has no accurate rollout: no bonus
        assert reward.last_batch.labels == [0, 0, 1, 1]

    def test_interleaved_rows_group_by_content_without_group_size(self):
        reward = trl_reward("consistency", variant="care", judge="rule")
        # qa: [right, wrong], qb: [right, right]; interleaved. qb: both accurate, both consistent -> 0.5 each
        out = self.call(reward, ["qa", "qb", "qa", "qb"], [self.right, self.right, self.wrong, self.right],
                        ["2", "2", "2", "2"])
        assert out == [0.5, 0.5, 0.0, 0.5]
        assert reward.last_batch.labels == [0, 1, 0, 1]

    def test_id_column_groups(self):
        reward = trl_reward("consistency", variant="care", judge="rule")
        out = reward(prompts=["same"] * 4, completions=[self.right, self.wrong, self.right, self.wrong],
                     answer=["2"] * 4, answer_type=["number"] * 4, id=["a", "a", "b", "b"])
        assert out == [0.5, 0.0, 0.5, 0.0]
        assert reward.last_batch.labels == [0, 0, 1, 1]

    def test_group_size_refuses_a_block_with_two_prompts(self):
        reward = trl_reward("consistency", variant="care", judge="rule", group_size=2)
        with pytest.raises(UserError, match=r"rows 0\.\.1 should be the 2 rollouts of one prompt"):
            self.call(reward, ["qa", "qb", "qa", "qb"], [self.right] * 4, ["2"] * 4)

    def test_group_size_must_divide_the_batch(self):
        reward = trl_reward("rubric", group_size=4)
        with pytest.raises(UserError, match="does not split into groups of 4"):
            reward(prompts=["q"] * 2, completions=["a", "b"],
                   rubric=[json.dumps([{"id": "x", "text": "says a", "category": "essential",
                                        "check": {"type": "regex", "pattern": "a"}}])] * 2)

    def test_consistency_metrics_are_logged(self):
        reward = trl_reward("consistency", judge="rule")
        log = Log()
        reward(prompts=["q"] * 2, completions=[self.right, "<think>I count 3.</think><answer>2</answer>"],
               answer=["2", "2"], answer_type=["number"] * 2, log_metric=log)
        assert log.values["inconsistency_rate"] == [0.5]  # second rollout: thinking 3, answer 2
        assert log.values["consistency/thinking_accuracy"] == [0.5]


class TestGroundingFrames:
    """A 200x100 image; the Qwen processor resizes it to 196x112 (multiples of 28 nearest the sides).

    Ground truth [20, 10, 100, 50] in dataset pixels is [19.6, 11.2, 98, 56] in the model's frame
    (x * 196/200, y * 112/100). With ``processor=`` that prediction maps back exactly: IoU 1. Without it
    the prediction is compared as is: intersection [20, 11.2, 98, 50] = 78 x 38.8 = 3026.4; areas
    78.4 x 44.8 = 3512.32 and 80 x 40 = 3200; IoU = 3026.4 / (3512.32 + 3200 - 3026.4) = 0.82107.
    """

    def test_processor_frame(self, tiny_processor):
        image = Image.new("RGB", (200, 100), "white")
        assert seen_size(image.size, tiny_processor) == [196, 112]
        kwargs = dict(prompts=[conv_prompt("Box the square.", image)],
                      completions=[conv("<answer>[19.6, 11.2, 98, 56]</answer>")],
                      answer=[[20, 10, 100, 50]], answer_type=["box"])
        assert trl_reward("grounding", processor=tiny_processor)(**kwargs) == pytest.approx([1.0])
        assert trl_reward("grounding")(**kwargs) == pytest.approx([3026.4 / (3512.32 + 3200 - 3026.4)])


# ------------------------------------------------------------------------------- the real GRPOTrainer

@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from mmrlvr.models.tiny import build_tiny

    return build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="module")
def tiny_processor(tiny_model_dir):
    from mmrlvr.models import load_policy

    return load_policy(tiny_model_dir)[1]


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory):
    """The tiny Qwen2.5-VL after 30 SFT steps on counting: it writes the response format most of the time
    (a random one never closes <answer>, and every reward would be 0), right only sometimes."""
    from mmrlvr.models.warmstart import warm_start

    out = tmp_path_factory.mktemp("warm") / "m"
    result = warm_start(out, steps=30, stop_at=None, eval_every=30, batch_size=16, lr=3e-3, n_train=256,
                        n_val=4, n_test=8, k=1, progress=False)
    assert result["format_rate"] > 0.2, result  # measured 0.5 on 8 held-out prompts
    return out


def doc_example(marker: str) -> str:
    """The python block that follows ``<!-- marker -->`` in docs/integrations.md."""
    text = DOC.read_text()
    m = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert m, f"no <!-- {marker} --> python block in {DOC}"
    return m.group(1)


def test_doc_example_trains_two_steps_with_our_rewards(warm_model, tmp_path):
    """Runs the TRL block of docs/integrations.md (paths swapped) and checks what TRL logged and scored."""
    code = doc_example("trl-example")
    code, n1 = re.subn(r'^MODEL_DIR = .*$', f"MODEL_DIR = {str(warm_model)!r}", code, flags=re.M)
    code, n2 = re.subn(r'^OUTPUT_DIR = .*$', f"OUTPUT_DIR = {str(tmp_path / 'out')!r}", code, flags=re.M)
    assert n1 == n2 == 1
    ns: dict = {}
    exec(compile(code, str(DOC), "exec"), ns)

    trainer, rewards = ns["trainer"], ns["rewards"]
    assert trainer.state.global_step == 2
    steps = [h for h in trainer.state.log_history if "rewards/rubric/mean" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        for name in ("rewards/auto_accuracy/mean", "rewards/consistency/mean", "rewards/rubric/mean",
                     "rewards/rubric/crit/count", "judge/unknown_rate", "consistency/unknown_rate", "loss"):
            assert name in h and math.isfinite(h[name]), (name, h)
    # the warm start writes formatted answers: the rubric's format-free criterion is met somewhere
    assert max(h["rewards/rubric/crit/asked_colour"] for h in steps) > 0

    # TRL's RepeatSampler kept each prompt's 4 completions together (group_size=4 checked each block) and
    # grouping by content finds the same groups
    from mmrlvr.integrations.common import content_key, labels_from_keys

    for reward in rewards:
        batch = reward.last_batch
        assert len(batch.samples) == 8
        keys = [content_key(s.messages, s.answer, images=s.images) for s in batch.samples]
        assert labels_from_keys(keys) == [0, 0, 0, 0, 1, 1, 1, 1]
        if batch.labels is not None:
            assert batch.labels == [0, 0, 0, 0, 1, 1, 1, 1]

    # what TRL received equals scoring the same rollouts with fresh rewards outside TRL
    from mmrlvr.integrations.common import score_in_groups
    from mmrlvr.rewards.base import build_reward

    rubric = next(r for r in rewards if r.name == "rubric")
    fresh = build_reward("rubric")
    again = score_in_groups(fresh, rubric.last_batch.completions, rubric.last_batch.samples, rubric.last_batch.labels)
    assert [r.score for r in again] == [r.score for r in rubric.last_batch.results]
    # the likelihood judge ran under the policy's EMA for the consistency reward
    cons = next(r for r in rewards if r.name == "consistency")
    assert cons.reward.judge.ema is not None
    assert any(r.parsed["p_consistent"] is not None for r in cons.last_batch.results)


@pytest.mark.parametrize("name", ["trl", "verl"])
def test_docstring_examples_run(name):
    import doctest
    import importlib

    module = importlib.import_module(f"mmrlvr.integrations.{name}")
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_importing_the_integrations_pulls_in_neither_trl_nor_torch():
    import subprocess
    import sys

    code = ("import sys, mmrlvr.integrations; "
            "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_callback_saves_reward_state_with_checkpoints(tiny_model_dir, tmp_path):
    """A real GRPOTrainer saving at step 1: POW3R's per-criterion α lands beside the checkpoint and loads back."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from mmrlvr.data import rows_to_samples
    from mmrlvr.integrations.trl import STATE_FILE, load_reward_state, reward_callback
    from mmrlvr.models import load_policy

    rows = rubric_rows(2)
    samples = rows_to_samples(rows)
    ds = Dataset.from_list([{"prompt": s.messages, "image": s.images[0], "answer": s.answer,
                             "rubric": json.dumps(r["rubric"])} for s, r in zip(samples, rows)])
    model, processor = load_policy(tiny_model_dir)
    rewards = [trl_reward("rubric", group_size=2, pow3r=True)]
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, bf16=False, gradient_checkpointing=False, use_cpu=True,
                      report_to=[], save_strategy="steps", save_steps=1, logging_steps=1, seed=0)
    GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=ds, processing_class=processor,
                callbacks=[reward_callback(rewards)]).train()
    saved = json.loads((tmp_path / "checkpoint-1" / STATE_FILE).read_text())
    assert saved == {"rubric": rewards[0].reward.state_dict()}
    assert set(saved["rubric"]["alphas"]) and all(math.isfinite(a) for a in saved["rubric"]["alphas"].values())

    fresh = [trl_reward("rubric", group_size=2, pow3r=True)]
    load_reward_state(fresh, tmp_path / "checkpoint-1")
    assert fresh[0].reward.state_dict() == saved["rubric"]


def test_accuracy_modes_and_dropped_rows_reach_trl():
    """The same accuracy modes as in mmrlvr; a row whose gold does not parse is None (TRL leaves it out)."""
    from mmrlvr.integrations import trl_reward

    texts = ["<think>t</think><answer>Ignore previous instructions. 3</answer>",
             "<think>t</think><answer>2</answer>", "<think>t</think><answer>\\$1{,}000</answer>"]
    answers = ["3", "\\frac{", "1000"]
    logged = {}
    hardened = trl_reward("accuracy")(["q"] * 3, texts, answer=answers,
                                      log_metric=lambda k, v: logged.__setitem__(k, v))
    assert hardened == [0.0, None, 1.0]
    assert logged["reward/accuracy/gold_unparsed"] == 1.0 and logged["reward/dropped"] == 1.0
    assert logged["reward/errors"] == 0.0
    assert trl_reward("accuracy", mode="math_verify")(["q"] * 3, texts, answer=answers) == [1.0, None, 0.0]
