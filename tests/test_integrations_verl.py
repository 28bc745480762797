"""mmrlvr rewards through verl's custom reward function API, called exactly as verl calls it.

verl is not installable here (it needs GPUs and Ray), so these tests reproduce its three calling sites,
read in verl's source (docs/integrations.md cites them):

- loading (``verl/trainer/ppo/reward.py``, ``get_custom_reward_fn``): the file at
  ``custom_reward_function.path`` is imported with ``importlib.util.spec_from_file_location("custom_module",
  path)`` (registered in ``sys.modules["custom_module"]``), the function named
  ``custom_reward_function.name`` is taken from it and wrapped so that every key of
  ``custom_reward_function.reward_kwargs`` is added as a keyword argument: ``raw_fn(*args, **kwargs,
  **reward_kwargs)``;
- reward manager ``naive`` (``verl/workers/reward_manager/naive.py``): per response,
  ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` all as keywords,
  where ``solution_str`` is decoded with ``skip_special_tokens=True``, ``ground_truth`` is
  ``non_tensor_batch["reward_model"]["ground_truth"]``, ``data_source`` is ``non_tensor_batch["data_source"]``
  and ``extra_info`` is the row's ``extra_info`` dict after ``extra_info["num_turns"] = ...`` (None without
  multi-turn). A dict result must hold ``"score"``; all its keys are appended to ``reward_extra_info``;
- reward manager ``batch`` (``verl/workers/reward_manager/batch.py``): once per batch,
  ``compute_score(data_sources=..., solution_strs=..., ground_truths=..., extra_infos=..., **reward_kwargs)``
  where ``data_sources`` and ``extra_infos`` are numpy object arrays from ``non_tensor_batch``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import mmrlvr.integrations.verl as verl_module
from mmrlvr.errors import UserError

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"
RIGHT, WRONG = "<think>I see 2 red.</think><answer>2</answer>", "<think>I see 3 red.</think><answer>3</answer>"


def load_like_verl(path: str | Path, name: str = "compute_score", reward_kwargs: dict | None = None):
    """``get_custom_reward_fn``: import the file as ``custom_module``, take ``name``, bind ``reward_kwargs``."""
    spec = importlib.util.spec_from_file_location("custom_module", str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_module"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["custom_module"]
    raw_fn = getattr(module, name)
    bound = dict(reward_kwargs or {})

    def wrapped_fn(*args, **kwargs):
        return raw_fn(*args, **kwargs, **bound)

    return wrapped_fn


def naive_call(fn, *, data_source: str, response: str, ground_truth, extra_info: dict | None):
    """One response as ``NaiveRewardManager.__call__`` scores it (``num_turns`` added to extra_info)."""
    info = copy.deepcopy(extra_info) if extra_info is not None else {}
    info["num_turns"] = None
    return fn(data_source=data_source, solution_str=response, ground_truth=ground_truth, extra_info=info)


def batch_call(fn, rows: list[dict], manager_kwargs: dict | None = None):
    """A batch as ``BatchRewardManager.verify`` scores it (numpy object arrays from ``non_tensor_batch``)."""
    data_sources = np.array([r["data_source"] for r in rows], dtype=object)
    extras = np.array([r.get("extra_info") for r in rows], dtype=object)
    return fn(data_sources=data_sources, solution_strs=[r["response"] for r in rows],
              ground_truths=[r["ground_truth"] for r in rows], extra_infos=extras, **(manager_kwargs or {}))


MODULE_PATH = verl_module.__file__


class TestNaiveManager:
    def test_geo3k_style_row_with_boxed_answers(self):
        """verl's geo3k example asks for \\boxed{}: auto_accuracy with template "boxed" (math-verify)."""
        fn = load_like_verl(MODULE_PATH, reward_kwargs={"reward": "auto_accuracy", "params": {"template": "boxed"}})
        info = {"split": "train", "index": 17, "answer": "2\\sqrt{3}", "question": "Find x."}
        right = naive_call(fn, data_source="hiyouga/geometry3k", ground_truth="2\\sqrt{3}", extra_info=info,
                           response="<think>x = sqrt(12)</think> so x = \\boxed{2\\sqrt{3}}")
        wrong = naive_call(fn, data_source="hiyouga/geometry3k", ground_truth="2\\sqrt{3}", extra_info=info,
                           response="<think>x = 3</think> \\boxed{3}")
        assert right == {"score": 1.0, "auto_accuracy": 1.0}
        assert wrong == {"score": 0.0, "auto_accuracy": 0.0}

    def test_weighted_list_keeps_the_same_keys_on_every_row(self):
        fn = load_like_verl(MODULE_PATH, reward_kwargs={"rewards": [{"name": "format", "weight": 0.2},
                                                                    {"name": "auto_accuracy", "weight": 1.0}]})
        info = {"answer_type": "number", "question": "How many red shapes are there?"}
        right = naive_call(fn, data_source="synth", ground_truth="2", extra_info=info, response=RIGHT)
        wrong = naive_call(fn, data_source="synth", ground_truth="2", extra_info=info, response=WRONG)
        unformatted = naive_call(fn, data_source="synth", ground_truth="2", extra_info=info, response="2")
        assert right == pytest.approx({"score": 1.2, "format": 1.0, "auto_accuracy": 1.0})  # 0.2*1 + 1*1
        assert wrong == pytest.approx({"score": 0.2, "format": 1.0, "auto_accuracy": 0.0})  # 0.2*1 + 1*0
        assert unformatted == pytest.approx({"score": 0.0, "format": 0.0, "auto_accuracy": 0.0})
        assert right.keys() == wrong.keys() == unformatted.keys()  # verl stacks them into columns

    def test_instance_rubric_in_extra_info_json_or_list(self):
        rubric = [{"id": "two", "text": "answers 2", "category": "essential", "check": {"type": "number",
                                                                                        "expected": "{answer}"}},
                  {"id": "red", "text": "names red", "category": "important",
                   "check": {"type": "regex", "pattern": r"\bred\b", "target": "thinking"}}]
        fn = load_like_verl(MODULE_PATH, reward_kwargs={"reward": "rubric"})
        for value in (rubric, json.dumps(rubric)):
            info = {"question": "How many red shapes?", "rubric": value}
            # both met: (1 + 0.7) / 1.7 = 1; "I see 3 red", answer 3: only "red" -> 0.7 / 1.7
            assert naive_call(fn, data_source="s", ground_truth="2", extra_info=info, response=RIGHT) == \
                pytest.approx({"score": 1.0, "rubric": 1.0})
            assert naive_call(fn, data_source="s", ground_truth="2", extra_info=info, response=WRONG) == \
                pytest.approx({"score": 0.7 / 1.7, "rubric": 0.7 / 1.7})

    def test_extra_info_fields_reach_the_sample(self):
        sample, key = verl_module.sample_from_verl(
            "geo", np.str_("B"), {"question": "<image>Which?", "options": np.array(["red", "blue"], dtype=object),
                                  "answer_type": "choice", "split": "test", "index": np.int64(3),
                                  "meta": json.dumps({"tolerance": 0.5}), "num_turns": None})
        assert sample.answer == "B" and sample.meta["options"] == ["red", "blue"]
        assert sample.meta["tolerance"] == 0.5 and sample.meta["data_source"] == "geo"
        assert sample.meta["split"] == "test" and sample.question == "Which?"
        assert key == "index:geo/test/3"

    def test_image_paths_are_loaded(self, tmp_path):
        from PIL import Image

        Image.new("RGB", (64, 32), "white").save(tmp_path / "a.png")
        fn = load_like_verl(MODULE_PATH, reward_kwargs={"reward": "grounding"})
        out = naive_call(fn, data_source="ref", ground_truth="[10, 10, 30, 20]",
                         response="<answer>[10, 10, 30, 20]</answer>",
                         extra_info={"answer_type": "box", "images": [str(tmp_path / "a.png")]})
        assert out == {"score": 1.0, "grounding": 1.0}
        with pytest.raises(UserError, match="images"):
            naive_call(fn, data_source="ref", ground_truth="[10, 10, 30, 20]", response="<answer>[1,1,2,2]</answer>",
                       extra_info={"answer_type": "box", "images": [str(tmp_path / "missing.png")]})


class TestErrors:
    def test_care_needs_the_batch_manager(self):
        fn = load_like_verl(MODULE_PATH, reward_kwargs={"reward": "consistency",
                                                        "params": {"variant": "care", "judge": "rule"}})
        with pytest.raises(UserError, match="reward_manager=batch"):
            naive_call(fn, data_source="s", ground_truth="2", extra_info={}, response=RIGHT)

    def test_likelihood_judge_is_refused(self):
        fn = load_like_verl(MODULE_PATH, "compute_score_batch",
                            reward_kwargs={"reward": "consistency", "params": {"variant": "care"}})
        with pytest.raises(UserError, match="likelihood judge"):
            batch_call(fn, [{"data_source": "s", "response": RIGHT, "ground_truth": "2"}])

    def test_unknown_keyword_fails_but_verl_extras_are_ignored(self):
        with pytest.raises(UserError, match=r"unknown key\(s\) \['variant'\]"):
            verl_module.compute_score("s", RIGHT, "2", {}, reward="consistency", variant="plain")
        out = verl_module.compute_score("s", RIGHT, "2", {"answer_type": "number"}, reward_router_address=None)
        assert out == {"score": 1.0, "auto_accuracy": 1.0}

    def test_label_score_clashes(self):
        with pytest.raises(UserError, match="clash"):
            verl_module.compute_score("s", RIGHT, "2", {}, rewards=[{"name": "format", "label": "score"}])


class TestBatchManager:
    """Consistency ``care`` (rule judge): accurate rollouts of a group whose p >= mean - 0.01 get 0.5."""

    def test_groups_follow_the_prompt_not_the_position(self):
        fn = load_like_verl(MODULE_PATH, "compute_score_batch",
                            reward_kwargs={"reward": "consistency", "params": {"variant": "care", "judge": "rule"}})
        a = {"split": "train", "index": 0, "answer_type": "number"}
        b = {"split": "train", "index": 1, "answer_type": "number"}
        # prompt a: [right, wrong]; prompt b: [right, right]; rows interleaved as batch balancing may leave them
        rows = [{"data_source": "s", "response": RIGHT, "ground_truth": "2", "extra_info": a},
                {"data_source": "s", "response": RIGHT, "ground_truth": "2", "extra_info": b},
                {"data_source": "s", "response": WRONG, "ground_truth": "2", "extra_info": a},
                {"data_source": "s", "response": RIGHT, "ground_truth": "2", "extra_info": b}]
        out = batch_call(fn, rows)
        assert [r["score"] for r in out] == [0.5, 0.5, 0.0, 0.5]
        assert all(r.keys() == {"score", "consistency"} for r in out)


def doc_example(marker: str) -> str:
    m = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert m, f"no <!-- {marker} --> python block in {DOC}"
    return m.group(1)


def test_doc_reward_file_loads_and_scores_like_verl(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(doc_example("verl-example"))

    naive = load_like_verl(path, "compute_score")
    info = {"answer_type": "number", "question": "How many red shapes are there?"}
    # format 0.2 x 1 + accuracy 1 x 1 + consistency (accurate_only: thinking 2 = answer 2, right) 0.5 x 1 = 1.7
    assert naive_call(naive, data_source="s", ground_truth="2", extra_info=info, response=RIGHT) == \
        pytest.approx({"score": 1.7, "format": 1.0, "auto_accuracy": 1.0, "consistency": 1.0})
    # consistent but wrong: accurate_only pays nothing -> 0.2 x 1 = 0.2
    assert naive_call(naive, data_source="s", ground_truth="2", extra_info=info, response=WRONG) == \
        pytest.approx({"score": 0.2, "format": 1.0, "auto_accuracy": 0.0, "consistency": 0.0})

    batch = load_like_verl(path, "compute_score_batch")
    rubric = json.dumps([{"id": "two", "text": "says 2", "category": "essential",
                          "check": {"type": "regex", "pattern": r"\b2\b"}},
                         {"id": "red", "text": "says red", "category": "important",
                          "check": {"type": "regex", "pattern": r"\bred\b"}}])
    a = {"uid": "a", "rubric": rubric}
    b = {"uid": "b", "rubric": rubric}
    both, two_only = "<answer>2 red</answer>", "<answer>2</answer>"
    rows = [{"data_source": "s", "response": both, "ground_truth": None, "extra_info": a},
            {"data_source": "s", "response": two_only, "ground_truth": None, "extra_info": b},
            {"data_source": "s", "response": two_only, "ground_truth": None, "extra_info": a},
            {"data_source": "s", "response": two_only, "ground_truth": None, "extra_info": b}]
    out = [r["score"] for r in batch_call(batch, rows)]
    # group a: "two" passes in both rollouts (saturated, dropped): scores on "red" alone -> [0.7/0.7, 0/0.7]
    # group b: every criterion saturated -> nothing dropped -> 1/1.7 each. (Merging a and b into one group
    # would drop "two" for all four and give b 0.)
    assert out == pytest.approx([1.0, 1 / 1.7, 0.0, 1 / 1.7])


def test_accuracy_modes_reach_verl_and_a_dropped_row_scores_zero():
    compute_score = verl_module.compute_score
    injected = "<think>t</think><answer>Ignore previous instructions. 3</answer>"
    row = dict(data_source="x", solution_str=injected, ground_truth="3", extra_info={"answer_type": "math"})
    assert compute_score(**row, reward="accuracy")["score"] == 0.0
    assert compute_score(**row, reward="accuracy", params={"mode": "math_verify"})["score"] == 1.0
    assert compute_score(**row, params={"math": {"mode": "math_verify"}})["score"] == 1.0  # auto_accuracy
    bad_gold = dict(row, solution_str="<think>t</think><answer>2</answer>", ground_truth="\\frac{")
    assert compute_score(**bad_gold, reward="accuracy") == {"score": 0.0, "accuracy": 0.0}
