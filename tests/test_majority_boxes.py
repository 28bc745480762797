"""Label-free votes on boxes (``majority_vote`` on ``answer_type: box`` rows): clusters by IoU, the medoid as the
pseudo-label, every box scored by its overlap with it, and the hedges that must not win — several boxes in one
answer, identical multi-box sets, a box over the whole image. Expected numbers are worked from the IoU formula
here, not from the reward's code."""

from __future__ import annotations

import pytest
from PIL import Image

from mmrlvr.rewards.base import build_reward, score_batch
from mmrlvr.types import Completion, Sample


def iou(a, b):  # by hand: overlap area over union area
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    return w * h / (area(a) + area(b) - w * h)


def box_text(*boxes):
    body = boxes[0] if len(boxes) == 1 else list(boxes)
    return f"<think>looking</think><answer>{body}</answer>"


def group(texts, gold="[10, 10, 50, 50]", size=(100, 100), answer_type="box"):
    samples = [Sample(id="g", messages=[], images=[Image.new("RGB", size)], answer=gold, answer_type=answer_type)
               for _ in texts]
    return [Completion(t) for t in texts], samples


def vote(texts, **params):
    reward = build_reward("majority_vote", **params)
    comps, samples = group(texts)
    results = score_batch(reward, comps, samples, [0] * len(texts))
    return results, reward.metrics()


A, B, C = [10, 10, 50, 50], [12, 10, 52, 50], [11, 11, 51, 51]  # three boxes on one object
FAR, CORNER = [60, 60, 90, 90], [0, 0, 30, 30]


def test_the_medoid_is_the_label_and_every_box_scores_its_overlap():
    results, metrics = vote([box_text(A), box_text(B), box_text(C), box_text(FAR), box_text(A, FAR, CORNER)])
    # A, B, C agree pairwise (IoU > 0.9): one cluster of 3 votes; FAR alone; the 3-box hedge agrees with no one.
    # The medoid has the largest summed IoU with the others: C (iou(A,C) + iou(B,C) > iou(A,B) + iou(A,C)).
    assert iou(A, C) + iou(B, C) > iou(A, B) + iou(A, C)
    assert results[0].parsed["pseudo_label"] == str(C)
    want = [iou(A, C), iou(B, C), 1.0, iou(FAR, C), iou(A, C) / 3]  # the hedge: its best IoU over max(3, 1) boxes
    assert [r.score for r in results] == pytest.approx(want)
    assert [r.components["agrees"] for r in results] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert results[0].parsed["majority_share"] == pytest.approx(3 / 5)
    assert results[0].parsed["pseudo_label_correct"] is True  # the one read of the gold answer
    assert metrics["majority/oversized"] == 0.0


def test_box_score_agree_scores_one_for_the_labels_cluster():
    results, _ = vote([box_text(A), box_text(B), box_text(FAR)], box_score="agree")
    assert [r.score for r in results] == [1.0, 1.0, 0.0]


def test_hedges_with_the_right_box_among_others_do_not_outvote_plain_answers():
    """Three answers each name the object's box A beside a different decoy; two plain answers name FAR. The hedges
    never agree with one another (different sets), so FAR's cluster is the largest and the label."""
    decoys = ([70, 0, 99, 20], [0, 70, 20, 99], [40, 80, 60, 99])
    hedges = [box_text(A, d) for d in decoys]
    results, _ = vote(hedges + [box_text(FAR), box_text(FAR)])
    assert results[0].parsed["pseudo_label"] == str(FAR)
    assert [r.score for r in results] == pytest.approx([0.0, 0.0, 0.0, 1.0, 1.0])


def test_identical_two_box_hedges_need_twice_the_rows_to_win():
    """Each answer naming k boxes casts 1/k of a vote: three identical {A, CORNER} hedges weigh 1.5 against two
    plain A answers' 2 — the plain answer is the label and the hedges score iou(A, A) / 2."""
    results, _ = vote([box_text(A, CORNER)] * 3 + [box_text(A)] * 2)
    assert results[0].parsed["pseudo_label"] == str(A)
    assert [r.score for r in results] == pytest.approx([0.5, 0.5, 0.5, 1.0, 1.0])
    results, _ = vote([box_text(A, CORNER)] * 4 + [box_text(A)])  # 2.0 against 1: the hedge's set wins
    assert results[-1].parsed["pseudo_label"] == str([A, CORNER])


def test_a_group_that_collapses_onto_the_whole_image_has_no_label():
    whole = [0, 0, 100, 100]  # 100 % of the 100 x 100 image, over the 0.8 guard
    results, metrics = vote([box_text(whole)] * 3 + [box_text([0, 0, 95, 95])])
    assert [r.score for r in results] == [0.0, 0.0, 0.0, 0.0]  # 0.9025 of the image: over the guard too
    assert results[0].parsed["pseudo_label"] is None and metrics["majority/oversized"] == 1.0
    results, _ = vote([box_text(whole)] * 3 + [box_text(A)])  # the one plain answer is the label
    assert results[-1].parsed["pseudo_label"] == str(A) and [r.score for r in results] == [0.0, 0.0, 0.0, 1.0]
    results, _ = vote([box_text(whole)] * 3 + [box_text(A)], max_area_fraction=None)  # guard off: the collapse wins
    assert results[0].parsed["pseudo_label"] == str(whole)


def test_normalised_coordinates_use_their_own_frame_for_the_guard():
    results, metrics = vote([box_text([0, 0, 1000, 1000])] * 2 + [box_text([100, 100, 500, 500])],
                            coords="normalized_1000")
    assert metrics["majority/oversized"] == pytest.approx(2 / 3)
    assert results[-1].score == 1.0


def test_the_votes_never_read_the_gold_box():
    texts = [box_text(A), box_text(B), box_text(FAR)]
    reward = build_reward("majority_vote")
    comps, samples = group(texts)
    with_gold = [r.score for r in score_batch(reward, comps, samples, [0] * 3)]
    comps, samples = group(texts, gold="[60, 60, 90, 90]")
    moved_gold = [r.score for r in score_batch(reward, comps, samples, [0] * 3)]
    assert with_gold == moved_gold


def test_multiple_choice_hedges_do_not_vote_for_every_option_they_name():
    texts = [f"<think>x</think><answer>{a}</answer>" for a in ("B", "(B)", "B or C", "C", "A and B")]
    reward = build_reward("majority_vote")
    comps, samples = group(texts, gold="B", answer_type="choice")
    results = score_batch(reward, comps, samples, [0] * len(texts))
    assert results[0].parsed["pseudo_label"] == "B"
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("params, match", [({"box_iou": 0}, "box_iou"), ({"box_score": "mean"}, "box_score"),
                                           ({"max_area_fraction": 1.5}, "max_area_fraction"),
                                           ({"coords": "pixels"}, "coords")])
def test_bad_parameters_are_refused(params, match):
    with pytest.raises(Exception, match=match):
        build_reward("majority_vote", **params)


# ------------------------------------------------------------------------------------ a real run and a resume
def test_the_grounding_config_trains_on_box_votes_and_resumes_exactly(tmp_path):
    """configs/grounding-tiny.yaml with the IoU reward replaced by box votes: two steps train on the votes (no gold
    read by the reward), the pseudo-label's accuracy is logged, and a run killed after step 1 and resumed equals the
    straight one."""
    import json

    from analysis_helpers import FAST_RUN, assert_same_final_state, cli, interrupted_copy

    args = [*FAST_RUN, "rollout.max_new_tokens=40", "max_steps=2", "save_every=1", "rewards.1.name=majority_vote",
            "rewards.1.params={coords: absolute}"]
    straight = tmp_path / "a"
    res = cli("train", "configs/grounding-tiny.yaml", f"output_dir={straight}", *args)
    assert res.returncode == 0, res.stderr[-2000:]
    interrupted_copy(straight, tmp_path / "b", 1)
    res = cli("train", "configs/grounding-tiny.yaml", f"output_dir={tmp_path / 'b'}", "--resume", *args)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    resumed = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for a, b in zip(rows, resumed[-2:]):
        assert {k: v for k, v in a.items() if a[k] != b.get(k) and not k.startswith("time/")} == {}
    assert_same_final_state(straight, tmp_path / "b")
    for r in rows:
        assert 0.0 <= r["majority/pseudo_label_accuracy"] <= 1.0 and "majority/oversized" in r
    assert max(r["reward/majority_vote"] for r in rows) > 0  # votes were cast and scored


def test_cocov_votes_on_boxes_by_the_same_rules():
    reward = build_reward("cocov", low=0.0, high=1.0)  # every group in the plain-majority mode
    comps, samples = group([box_text([0, 0, 100, 100])] * 3 + [box_text(A), box_text(B)])
    results = score_batch(reward, comps, samples, [0] * 5)
    assert [r.score for r in results] == [0.0, 0.0, 0.0, 1.0, 1.0]  # the whole-image boxes do not vote
