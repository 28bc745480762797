"""Grounding: box parsing in every output form, IoU arithmetic, matching, coordinate frames, guards."""

from __future__ import annotations

import itertools
import random

import pytest
from PIL import Image

from mmrlvr.errors import DataError
from mmrlvr.boxes import iou, to_frame
from mmrlvr.rewards.grounding import GroundingReward, location_boxes, match_boxes, parse_boxes
from mmrlvr.types import Sample


def box_sample(answer, size=(100, 100), **meta):
    return Sample(id="g", messages=[], images=[Image.new("RGB", size)], answer=answer, answer_type="box", meta=meta)


def r1(answer):
    return f"<think>The cat is on the left.</think><answer>{answer}</answer>"


PARSE_CASES = [
    ("json_list", "[10, 20, 30, 40]", [(10, 20, 30, 40)]),
    ("json_floats", "[10.5, 20, 30.25, 40]", [(10.5, 20, 30.25, 40)]),
    ("json_list_of_lists", "[[1, 2, 3, 4], [5, 6, 7, 8]]", [(1, 2, 3, 4), (5, 6, 7, 8)]),
    ("qwen25_dict", '{"bbox_2d": [1, 2, 3, 4], "label": "cat"}', [(1, 2, 3, 4)]),
    ("qwen25_list_of_dicts", '[{"bbox_2d": [1, 2, 3, 4], "label": "cat"}, {"bbox_2d": [5, 6, 7, 8]}]',
     [(1, 2, 3, 4), (5, 6, 7, 8)]),
    ("json_fence", '```json\n[\n  {"bbox_2d": [1, 2, 3, 4], "label": "cat"}\n]\n```', [(1, 2, 3, 4)]),
    ("other_keys", '{"bbox": [1, 2, 3, 4]} {"box": [5, 6, 7, 8]}', [(1, 2, 3, 4), (5, 6, 7, 8)]),
    ("corner_keys", '{"x1": 1, "y1": 2, "x2": 3, "y2": 4}', [(1, 2, 3, 4)]),
    ("python_tuple", "(1, 2, 3, 4)", [(1, 2, 3, 4)]),
    ("python_single_quotes", "[{'bbox_2d': [1, 2, 3, 4]}]", [(1, 2, 3, 4)]),
    ("box_in_a_sentence", "The cat is at [10, 20, 30, 40].", [(10, 20, 30, 40)]),
    ("qwen2_special_tokens", "<|object_ref_start|>cat<|object_ref_end|><|box_start|>(100,200),(300,400)<|box_end|>",
     [(100, 200, 300, 400)]),
    ("qwen2_tokens_stripped", "cat(100,200),(300,400)", [(100, 200, 300, 400)]),
    ("point_pairs_as_lists", "[[100, 200], [300, 400]]", [(100, 200, 300, 400)]),
    ("no_box", "on the left", []),
    ("three_numbers", "[1, 2, 3]", []),
    ("booleans_are_not_numbers", "[true, false, true, 1]", []),
    ("code_is_not_evaluated", "__import__('os').system('echo hacked')", []),
]


@pytest.mark.parametrize("case,text,expected", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_boxes_table(case, text, expected):
    assert parse_boxes(text) == [tuple(float(v) for v in b) for b in expected]


class TestIoU:
    def test_identical_boxes(self):
        assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0

    def test_half_overlap(self):
        # overlap 5x10 = 50; union 100 + 100 - 50 = 150
        assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(1 / 3)

    def test_contained_box(self):
        # inner 5x5 = 25 inside 10x10 = 100: IoU = 25 / 100
        assert iou((0, 0, 10, 10), (0, 0, 5, 5)) == 0.25

    def test_disjoint_and_touching(self):
        assert iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
        assert iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0

    def test_degenerate_boxes_never_overlap(self):
        assert iou((10, 10, 0, 0), (0, 0, 10, 10)) == 0.0  # corners swapped: zero area
        assert iou((5, 5, 5, 5), (5, 5, 5, 5)) == 0.0


class TestMatching:
    def test_hungarian_never_loses_to_greedy_and_sometimes_wins(self):
        rng = random.Random(0)

        def rand_box():
            x, y = rng.uniform(0, 60), rng.uniform(0, 60)
            return (x, y, x + rng.uniform(10, 40), y + rng.uniform(10, 40))

        strictly_better = 0
        for _ in range(200):
            pred, gold = [rand_box() for _ in range(3)], [rand_box() for _ in range(3)]
            greedy = sum(m[2] for m in match_boxes(pred, gold, "greedy"))
            optimal = sum(m[2] for m in match_boxes(pred, gold, "hungarian"))
            assert optimal >= greedy - 1e-12
            strictly_better += optimal > greedy + 1e-9
        assert strictly_better > 0  # greedy is myopic on some overlapping layouts

    @pytest.mark.parametrize("seed", range(40))
    def test_hungarian_equals_brute_force(self, seed):
        rng = random.Random(seed)

        def rand_box():
            x, y = rng.uniform(0, 80), rng.uniform(0, 80)
            return (x, y, x + rng.uniform(5, 40), y + rng.uniform(5, 40))

        pred = [rand_box() for _ in range(rng.randint(1, 5))]
        gold = [rand_box() for _ in range(rng.randint(1, 5))]
        ious = [[iou(p, g) for g in gold] for p in pred]
        k = min(len(pred), len(gold))
        best = max(
            sum(ious[i][j] for i, j in zip(rows, cols))
            for rows in itertools.permutations(range(len(pred)), k)
            for cols in [tuple(range(len(gold)))[:k]] + list(itertools.permutations(range(len(gold)), k))
        )
        matches = match_boxes(pred, gold, "hungarian")
        assert sum(m[2] for m in matches) == pytest.approx(best)
        assert len({m[0] for m in matches}) == len(matches) == len({m[1] for m in matches})  # one-to-one

    def test_unknown_matching_is_an_error(self):
        with pytest.raises(ValueError, match="hungarian, greedy"):
            match_boxes([(0, 0, 1, 1)], [(0, 0, 1, 1)], "optimal")


class TestFrames:
    def test_qwen25_absolute_pixels_of_the_resized_image(self):
        # model saw 200x100; ground truth is in the 400x200 original: every coordinate doubles
        s = box_sample("[100, 100, 200, 200]", size=(200, 100), orig_size=[400, 200])
        r = GroundingReward(coord_format="abs")(r1("[50, 50, 100, 100]"), s)
        assert r.score == 1.0 and r.parsed["boxes"] == [[100.0, 100.0, 200.0, 200.0]]
        assert r.parsed["image_boxes"] == [[50.0, 50.0, 100.0, 100.0]]  # for drawing on the image the model saw

    def test_qwen2_normalised_1000(self):
        # x: 250/1000*400 = 100, 500/1000*400 = 200; y: 500/1000*200 = 100, 1000/1000*200 = 200
        s = box_sample("[100, 100, 200, 200]", size=(200, 100), orig_size=[400, 200])
        text = r1("<|box_start|>(250,500),(500,1000)<|box_end|>")
        assert GroundingReward(coord_format="norm1000")(text, s).score == 1.0

    def test_normalised_0_to_1(self):
        s = box_sample("[25, 25, 75, 75]")
        assert GroundingReward(coord_format="norm1")(r1("[0.25, 0.25, 0.75, 0.75]"), s).score == 1.0

    def test_explicit_resized_size_wins_over_the_image(self):
        s = box_sample("[20, 20, 40, 40]", size=(100, 100), resized_size=[50, 50], orig_size=[100, 100])
        assert GroundingReward()(r1("[10, 10, 20, 20]"), s).score == 1.0

    def test_ground_truth_in_normalised_coordinates(self):
        s = box_sample("[250, 250, 750, 750]")
        assert GroundingReward(target_format="norm1000")(r1("[25, 25, 75, 75]"), s).score == 1.0

    def test_boxes_are_clipped_to_the_image(self):
        # [-10, -10, 20, 20] clips to [0, 0, 20, 20]: identical to the target
        assert GroundingReward()(r1("[-10, -10, 20, 20]"), box_sample("[0, 0, 20, 20]")).score == 1.0

    def test_to_frame_needs_a_size_for_normalised_boxes(self):
        with pytest.raises(ValueError, match="image size"):
            to_frame([(0, 0, 1, 1)], "norm1", None, None)

    def test_no_size_at_all_keeps_absolute_boxes(self):
        s = Sample(id="g", messages=[], images=[], answer="[0, 0, 10, 10]", answer_type="box")
        assert GroundingReward()(r1("[0, 0, 10, 10]"), s).score == 1.0

    def test_bad_size_metadata_is_a_data_error(self):
        with pytest.raises(DataError, match="orig_size"):
            GroundingReward()(r1("[0, 0, 1, 1]"), box_sample("[0, 0, 1, 1]", orig_size=[0, 10]))


class TestGroundingReward:
    def test_threshold_mode(self):
        s = box_sample("[0, 0, 10, 10]")
        # IoU 1/3 (see TestIoU.test_half_overlap) fails a 0.5 threshold; IoU 0.81 passes
        assert GroundingReward(threshold=0.5)(r1("[5, 0, 15, 10]"), s).score == 0.0
        r = GroundingReward(threshold=0.5)(r1("[0, 0, 9, 9]"), s)  # 81 / 100
        assert r.score == 1.0 and r.components["iou"] == pytest.approx(0.81)

    def test_several_targets_mean_over_the_larger_count(self):
        s = box_sample("[[0, 0, 10, 10], [50, 50, 60, 60]]")
        # one exact, one missing: (1 + 0) / max(1, 2)
        assert GroundingReward()(r1("[0, 0, 10, 10]"), s).score == pytest.approx(0.5)
        # both exact, listed in the other order: Hungarian pairs them correctly
        assert GroundingReward()(r1("[[50, 50, 60, 60], [0, 0, 10, 10]]"), s).score == 1.0
        # both exact plus a spurious third box: 2 / 3
        three = "[[50, 50, 60, 60], [0, 0, 10, 10], [80, 80, 90, 90]]"
        assert GroundingReward()(r1(three), s).score == pytest.approx(2 / 3)

    def test_large_targets_are_not_guarded(self):
        s = box_sample("[0, 0, 95, 95]")  # target covers 90% of the image: a big prediction is honest
        assert GroundingReward()(r1("[0, 0, 100, 100]"), s).score == pytest.approx(95 * 95 / 10000)

    @pytest.mark.parametrize("answer,problem", [
        ("nowhere", "no_box"), ("[0, 0, 1]", "box_unparsed"), ("[10, 10, 0, 0]", "degenerate_box"),
        ("[NaN, 0, 10, 10]", "invalid_box"), ("［０，０，１］", "box_unparsed"), ("[0 0 1]", "box_unparsed"),
        ('{"bbox_2d": ["zero", "0", "1", "1"]}', "box_unparsed"),
    ])
    def test_unusable_boxes_score_zero(self, answer, problem):
        r = GroundingReward()(r1(answer), box_sample("[0, 0, 10, 10]"))
        assert r.score == 0.0 and problem in r.parsed["problems"]

    def test_raw_template_reads_text_after_thinking(self):
        text = "<think>cat</think>[0, 0, 10, 10]"
        assert GroundingReward(template="raw")(text, box_sample("[0, 0, 10, 10]")).score == 1.0
        assert GroundingReward()(text, box_sample("[0, 0, 10, 10]")).score == 0.0  # r1 wants <answer>

    def test_ground_truth_without_a_box_is_a_data_error(self):
        with pytest.raises(DataError, match="no box"):
            GroundingReward()(r1("[0, 0, 1, 1]"), box_sample("the cat"))

    def test_bad_params(self):
        for kwargs in ({"coord_format": "xyxy"}, {"matching": "best"}, {"threshold": 0}, {"max_area_fraction": 2}):
            with pytest.raises(ValueError):
                GroundingReward(**kwargs)


# ---------------------------------------------------------------------------------------- location tokens
# Each model's grid, worked by hand: PaliGemma n / 1024 in y1 x1 y2 x2 order; Florence-2 bin centres
# (n + 0.5) / 1000 in x1 y1 x2 y2 order; Kosmos-2 cells of a 32 x 32 grid (index = row * 32 + column).

@pytest.mark.parametrize("text,expected", [
    ("<loc0256><loc0512><loc0768><loc1023> dog", [(0.5, 0.25, 1023 / 1024, 0.75)]),
    ("<loc0000><loc0000><loc0512><loc0512> a ; <loc0512><loc0512><loc1000><loc1000> b",
     [(0.0, 0.0, 0.5, 0.5), (0.5, 0.5, 1000 / 1024, 1000 / 1024)]),
    ("car<loc_0><loc_10><loc_999><loc_500>", [(0.0005, 0.0105, 0.9995, 0.5005)]),
    ("<p>the cat</p> {<21><34><55><100>}", [(0.21, 0.34, 0.55, 1.0)]),  # MiniGPT-v2, n / 100
    # Kosmos-2: cells 33 (row 1, col 1) and 66 (row 2, col 2): centre to centre, 1.5/32 .. 2.5/32
    ("<object><patch_index_0033><patch_index_0066></object>", [(1.5 / 32, 1.5 / 32, 2.5 / 32, 2.5 / 32)]),
    # same row (cells 32 and 35): edge to edge, columns 0..3 -> 0 .. 4/32, row 1 -> 1/32 .. 2/32
    ("<patch_index_0032><patch_index_0035>", [(0.0, 1 / 32, 4 / 32, 2 / 32)]),
    # one cell: that cell
    ("<patch_index_0005><patch_index_0005>", [(5 / 32, 0.0, 6 / 32, 1 / 32)]),
    # two objects of one phrase, Kosmos-2's delimiter between them
    ("<object><patch_index_0000><patch_index_0033><delimiter_of_multi_objects/><patch_index_0990>"
     "<patch_index_1023></object>", [(0.5 / 32, 0.5 / 32, 1.5 / 32, 1.5 / 32),
                                     (30.5 / 32, 30.5 / 32, 31.5 / 32, 31.5 / 32)]),
])
def test_location_tokens_decode_on_their_grids(text, expected):
    got = location_boxes(text)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g == pytest.approx(e, abs=1e-12)


@pytest.mark.parametrize("text", ["<loc1024><loc0000><loc0512><loc0512>", "<loc0001><loc0002><loc0003>",
                                  "<loc_1000><loc_1><loc_2><loc_3>", "<patch_index_1024><patch_index_0001>",
                                  "<patch_index_0001>", "[10, 20, 30, 40]", "location 0102", "{<101><0><5><5>}",
                                  "{<1><2><3>}", r"\frac{1}{2}"])
def test_what_is_not_a_location_box(text):
    assert location_boxes(text) == []


def test_location_tokens_set_their_frame_whatever_coords_says():
    s = box_sample("[20, 10, 60, 30]", size=(200, 100))  # x1 y1 x2 y2 in pixels of a 200 x 100 image
    paligemma = "<loc0102><loc0102><loc0307><loc0307> cat"  # y 0.0996..0.2998, x 0.0996..0.2998
    for coords in ("absolute", "normalized_1000", "normalized_1"):
        r = GroundingReward(coords=coords)(r1(paligemma), s)
        assert r.parsed["boxes"][0] == pytest.approx([102 / 1024 * 200, 102 / 1024 * 100, 307 / 1024 * 200,
                                                      307 / 1024 * 100])
        assert r.score > 0.98
    # the order matters: read as x1 y1 x2 y2 the same tokens would be another box
    swapped = GroundingReward()(r1("<loc0102><loc0102><loc0614><loc0307>"), s)  # y2 0.6, x2 0.3
    assert swapped.parsed["boxes"][0] == pytest.approx([102 / 1024 * 200, 102 / 1024 * 100, 307 / 1024 * 200,
                                                        614 / 1024 * 100])


def test_a_gold_in_location_tokens_is_read_in_its_own_frame():
    s = box_sample("<loc_99><loc_199><loc_499><loc_799>", size=(200, 100))
    gold = GroundingReward().target_boxes(s)
    assert gold == [pytest.approx((99.5 / 1000 * 200, 199.5 / 1000 * 100, 499.5 / 1000 * 200, 799.5 / 1000 * 100))]
    assert GroundingReward()(r1("[19.9, 19.95, 99.9, 79.95]"), s).score == pytest.approx(1.0)


def test_broken_location_tokens_are_counted_as_unparsed_not_as_no_box():
    reward = GroundingReward()
    for text in ("<loc1500><loc0102><loc0512><loc0512>", "<loc0102><loc0102><loc0512> cat", "<patch_index_0003>"):
        r = reward(r1(text), box_sample("[10, 10, 50, 50]"))
        assert r.score == 0.0 and r.parsed["problems"] == ["box_unparsed"]
        assert "location tokens" in r.parsed["box_error"]
    assert reward.metrics()["reward/grounding/box_unparsed"] == 3.0


def test_the_loader_reads_location_token_answers_as_pixels_of_the_image():
    from mmrlvr.data.loading import load_samples

    im = Image.new("RGB", (224, 112))  # a multiple of 28 each way: the loader keeps its size
    rows = [{"problem": "Where is the cat?", "answer": "<loc0256><loc0128><loc0768><loc0512> cat", "images": [im]},
            {"problem": "Where?", "answer": "<phrase>it</phrase><object><patch_index_0033><patch_index_0066></object>",
             "answer_type": "box", "images": [im]}]
    samples, _ = load_samples(rows, preset="vlm_r1")  # a layout that guesses the answer type
    assert [s.answer_type for s in samples] == ["box", "box"]
    assert samples[0].meta["answer_original"] == pytest.approx([0.125 * 224, 0.25 * 112, 0.5 * 224, 0.75 * 112])
    assert GroundingReward()(r1("[28, 28, 112, 84]"), samples[0]).score == pytest.approx(1.0)
    assert samples[1].meta["answer_original"] == pytest.approx([1.5 / 32 * 224, 1.5 / 32 * 112, 2.5 / 32 * 224,
                                                                2.5 / 32 * 112])


def test_answers_in_location_tokens_agree_by_iou_in_the_image_frame():
    """The group vote and the consistency check compare two answers with ``same_answer``; location tokens are on
    their own grid, so two PaliGemma answers (or one and a pixel box) are compared in the image's frame."""
    from mmrlvr.rewards import MajorityVote, same_answer

    s = box_sample("[0, 0, 1, 1]", size=(200, 100))  # the gold plays no part
    near = "<loc0102><loc0102><loc0512><loc0512> cat"  # x 19.9..100, y 9.96..50 in pixels
    assert same_answer(near, "<loc0100><loc0100><loc0510><loc0510>", s)
    assert not same_answer(near, "<loc0600><loc0600><loc1000><loc1000>", s)
    assert same_answer(near, "[20, 10, 100, 50]", s)  # the same box in pixels of the 200 x 100 image
    texts = [r1(a) for a in (near, "<loc0100><loc0100><loc0510><loc0510>", "<loc0600><loc0600><loc1000><loc1000>")]
    scores = [r.score for r in MajorityVote(box_score="agree").score_batch(texts, [s] * 3, group_index=[0, 0, 0])]
    assert scores == [1.0, 1.0, 0.0]
    graded = [r.score for r in MajorityVote().score_batch(texts, [s] * 3, group_index=[0, 0, 0])]
    assert graded[0] == 1.0 and 0.95 < graded[1] < 1.0 and graded[2] == 0.0  # the IoU with the label, in pixels
