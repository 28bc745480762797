"""data.max_prompt_length: rows that do not fit are dropped whole, never cut inside an image block.

Property test over random prompt lengths, image counts, image sizes and limits, with the real tiny
Qwen2.5-VL processor: every kept prompt, encoded as the rollout engine encodes it, is within the limit and
holds each image's complete run of <|image_pad|> tokens (w/28 * h/28 per image: 14-px patches merged 2x2,
worked by hand from the Qwen2.5-VL layout, not read from our code); every dropped row was over the limit.
"""

from __future__ import annotations

import random

import pytest
from PIL import Image

from mmrlvr.data.length import LengthReport, filter_by_length, prompt_lengths
from mmrlvr.data.prompts import build_messages
from mmrlvr.errors import UserError
from mmrlvr.types import Sample

WORDS = "how many red blue green shapes squares circles are there in the picture left right".split()


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from mmrlvr.models.compat import load_processor
    from mmrlvr.models.tiny import build_tiny

    path = build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m")
    return load_processor(path, "qwen2_5_vl")


def random_sample(rng: random.Random, i: int) -> Sample:
    n_images = rng.randint(1, 3)
    sizes = [(28 * rng.randint(1, 6), 28 * rng.randint(1, 6)) for _ in range(n_images)]
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
    problem = " ".join("<image>" for _ in range(n_images)) + " " + text if rng.random() < 0.5 else text
    return Sample(id=f"s{i}", messages=build_messages(problem, n_images, rng.choice(["r1", "plain", "boxed"])),
                  images=[Image.new("RGB", s, (i % 255, 0, 0)) for s in sizes], answer="1")


def image_blocks(ids: list[int], tok) -> list[int]:
    """Lengths of the <|image_pad|> runs between <|vision_start|> and <|vision_end|>; -1 for a broken block."""
    start, end, pad = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"))
    blocks, i = [], 0
    while i < len(ids):
        if ids[i] == start:
            j = i + 1
            while j < len(ids) and ids[j] == pad:
                j += 1
            blocks.append(j - i - 1 if j < len(ids) and ids[j] == end else -1)
            i = j
        i += 1
    return blocks


def test_lengths_match_the_engine_encoding(processor):
    from mmrlvr.rollout.hf import prompt_texts

    rng = random.Random(0)
    samples = [random_sample(rng, i) for i in range(12)]
    lengths = prompt_lengths(samples, processor)
    for s, n in zip(samples, lengths):
        enc = processor(text=prompt_texts(processor, [s]), images=s.images)
        ids = list(enc["input_ids"][0])
        assert n == len(ids)
        assert image_blocks(ids, processor.tokenizer) == [(w // 28) * (h // 28) for w, h in (im.size for im in s.images)]


def test_no_prompt_is_ever_cut_inside_an_image_block(processor):
    from mmrlvr.rollout.hf import prompt_texts

    rng = random.Random(1)
    tok = processor.tokenizer
    for trial in range(25):
        samples = [random_sample(rng, 100 * trial + i) for i in range(rng.randint(1, 8))]
        limit = rng.randint(20, 160)
        kept, report = filter_by_length(samples, processor, limit, max_dropped_share=1.0, source="t")
        assert report.n_kept + report.n_dropped == len(samples)
        kept_ids = {s.id for s in kept}
        for s in samples:
            ids = processor(text=prompt_texts(processor, [s]), images=s.images)["input_ids"][0]
            blocks = image_blocks(ids, tok)
            assert -1 not in blocks and len(blocks) == len(s.images)
            if s.id in kept_ids:
                assert len(ids) <= limit
                assert blocks == [(w // 28) * (h // 28) for w, h in (im.size for im in s.images)]
                assert s.messages == next(x for x in samples if x.id == s.id).messages  # nothing rewritten
            else:
                assert len(ids) > limit and s.id in report.dropped_ids


def test_too_many_dropped_stops_with_a_clear_error(processor):
    rng = random.Random(2)
    samples = [random_sample(rng, i) for i in range(10)]
    with pytest.raises(UserError, match=r"data: train.parquet: 10 of 10 rows \(100.0%\) have prompts longer than "
                                        r"data.max_prompt_length=5 tokens \(e.g. row 's0'"):
        filter_by_length(samples, processor, 5, max_dropped_share=0.5, source="train.parquet")


def test_warning_line_and_metrics():
    report = LengthReport(source="d", max_prompt_length=64, n_in=4, n_kept=3, dropped_ids=["row-7"],
                          dropped_lengths=[90])
    assert report.warning() == ("data: d: dropped 1 of 4 rows (25.0%) whose prompt is longer than "
                                "data.max_prompt_length=64 tokens (e.g. row 'row-7': 90 tokens); prompts are never cut")
    assert report.metrics() == {"data/dropped_too_long": 1.0, "data/dropped_too_long_share": 0.25}
    assert LengthReport(source="d", max_prompt_length=64, n_in=4, n_kept=4).warning() is None


def test_load_split_drops_long_rows_and_reports(processor, tmp_path, capsys):
    from mmrlvr.config import load_config
    from mmrlvr.train.data import load_split

    rows = [{"problem": "<image>" + " ".join(["how many"] * k), "answer": "1",
             "images": [Image.new("RGB", (56, 56))]} for k in (1, 2, 40)]
    import json

    path = tmp_path / "d.jsonl"
    import base64
    import io

    buf = io.BytesIO()
    Image.new("RGB", (56, 56)).save(buf, format="PNG")
    b64 = base64.b64encode(buf.getvalue()).decode()
    path.write_text("".join(json.dumps({**r, "images": [b64]}) + "\n" for r in rows))
    cfg = load_config(None, [f"data.train={path}", "data.max_prompt_length=60", "data.max_dropped_share=0.5",
                             "data.template=plain"])
    reports: list = []
    samples = load_split(str(path), cfg.data, "train", processor=processor, reports=reports)
    assert [s.id for s in samples] == ["d-0", "d-1"]
    assert reports[-1].metrics()["data/dropped_too_long"] == 1.0
    err = capsys.readouterr().err
    assert "dropped 1 of 3 rows" in err and "row 'd-2'" in err
