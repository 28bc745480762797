"""Rollout store: record <-> Parquet round trip, atomic shards, background errors, image store."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw

from mmrlvr.errors import UserError
from mmrlvr.store import (
    ROLLOUT_SCHEMA,
    ImageStore,
    RolloutReader,
    RolloutRecord,
    RolloutWriter,
    RolloutWriterError,
    UnsafePathError,
    atomic_write_json,
    atomic_write_text,
    resolve_in_run,
)
from mmrlvr.store.atomic import remove_stale_temp_files, temp_path_for


def make_record(step: int, prompt: str, i: int, *, reward: float = 1.0, adv: float = 0.5, G: int = 4,
                text: str = "<think>I see 2 red.</think><answer>2</answer>", full: bool = True,
                components: dict | None = None, finish: str = "stop") -> RolloutRecord:
    ids = [5, 6, 7]
    rec = RolloutRecord(run_id="r1", step=step, prompt_id=prompt, sample_index=i, group_size=G,
                        prompt_text="How many red shapes?", response_text=text, response_token_ids=ids,
                        reward=reward, advantage=adv, finish_reason=finish,
                        reward_components=components if components is not None else {"format": 1.0,
                                                                                       "accuracy": reward})
    if full:
        rec.response_tokens = ["<think>", "2", "</think>"]
        rec.token_logprob = [-0.5, -1.25, -0.125]
        rec.token_entropy = [0.5, 1.0, 0.25]
        rec.token_vision_sensitivity = [0.0, 2.0, 0.0]
        rec.token_credit_weight = [0.0, 1.0, 0.0]
        rec.token_advantage = [adv] * 3
        rec.token_ratio = [1.0, 1.5, 0.75]
        rec.image_refs = ["images/ab/abc.png"]
        rec.ground_truth = "2"
        rec.parsed_answer = "2"
        rec.parsed_boxes = [[1.0, 2.0, 30.0, 40.0]]
        rec.gt_boxes = [[0.0, 0.0, 32.0, 40.0], [50.0, 50.0, 60.0, 60.0]]
        rec.rubric_results = [{"id": "c1", "text": "Counts the red shapes", "category": "accuracy",
                               "verdict": "pass", "score": 1.0, "weight": 2.0, "rationale": "ok",
                               "judge": "verifier"}]
        rec.consistency = {"verdict": "consistent", "p_consistent": 0.875, "conclusion": "2",
                           "conclusion_span": [14, 15], "thinking_correct": True, "answer_correct": True}
        rec.config_hash = "cafe"
        rec.git_commit = "abc123"
        rec.extra = {"seed": 7, "note": "x"}
    return rec


def test_round_trip_all_fields(tmp_path: Path) -> None:
    records = [make_record(3, "p0", i, reward=float(i)) for i in range(4)]
    with RolloutWriter(tmp_path, "r1") as w:
        w.write_step(3, records)
    reader = RolloutReader(tmp_path)
    assert reader.steps() == [3]
    back = reader.read_step(3)
    assert back == records  # dataclass equality: every field survives (float32 values chosen exact)
    assert reader.group(3, "p0")[2] == records[2]


def test_schema_stable_when_optional_fields_empty(tmp_path: Path) -> None:
    with RolloutWriter(tmp_path, "r1") as w:
        w.write_step(0, [make_record(0, "p", 0, full=False)])
        w.write_step(1, [make_record(1, "p", 0, full=True)])
    s0 = pq.read_schema(tmp_path / "rollouts/step-00000000.parquet")
    s1 = pq.read_schema(tmp_path / "rollouts/step-00000001.parquet")
    assert s0.remove_metadata() == s1.remove_metadata() == ROLLOUT_SCHEMA.remove_metadata()
    rec = RolloutReader(tmp_path).read_step(0)[0]
    assert rec.token_entropy == [] and rec.consistency is None and rec.parsed_boxes == []


def test_readable_by_pyarrow_pandas_and_datasets(tmp_path: Path) -> None:
    with RolloutWriter(tmp_path, "r1") as w:
        for step in range(2):
            w.write_step(step, [make_record(step, f"p{g}", i) for g in range(2) for i in range(4)])
    files = sorted(str(p) for p in (tmp_path / "rollouts").glob("step-*.parquet"))
    # pyarrow
    table = pq.read_table(files[0])
    assert table.num_rows == 8 and table.column("reward_components")[0].as_py() == '{"accuracy": 1.0, "format": 1.0}'
    # pandas (whole folder)
    df = pd.read_parquet(tmp_path / "rollouts")
    assert len(df) == 16
    assert json.loads(df["reward_components"].iloc[0]) == {"accuracy": 1.0, "format": 1.0}
    assert df["rubric_results"].iloc[0][0]["verdict"] == "pass"
    assert df["consistency"].iloc[0]["p_consistent"] == 0.875
    # datasets
    import datasets

    ds = datasets.load_dataset("parquet", data_files=files, split="train",
                               cache_dir=str(tmp_path / "hf_cache"))
    assert len(ds) == 16
    row = ds[0]
    assert row["parsed_boxes"] == [[1.0, 2.0, 30.0, 40.0]]
    assert row["consistency"]["conclusion_span"] == [14, 15]
    assert row["token_logprob"] == [-0.5, -1.25, -0.125]
    assert RolloutRecord.from_row(row) == make_record(row["step"], row["prompt_id"], row["sample_index"])


def test_numpy_token_arrays_are_accepted(tmp_path: Path) -> None:
    rec = make_record(0, "p", 0)
    rec.token_entropy = np.array([0.5, 1.0, 0.25], dtype=np.float32)
    rec.reward_components = {"format": np.float64(1.0)}
    with RolloutWriter(tmp_path, "r1", background=False) as w:
        w.write_step(0, [rec])
    back = RolloutReader(tmp_path).read_step(0)[0]
    assert back.token_entropy == [0.5, 1.0, 0.25] and back.reward_components == {"format": 1.0}


def test_record_validation_names_the_field() -> None:
    rec = make_record(0, "p", 0)
    rec.token_entropy = [0.1]
    with pytest.raises(ValueError, match="token_entropy has 1 values for 3 response tokens"):
        rec.to_row()
    rec = make_record(0, "p", 0)
    rec.parsed_boxes = [[1, 2, 3]]
    with pytest.raises(ValueError, match=r"parsed_boxes\[0\]"):
        rec.to_row()


def test_writer_checks_run_id_and_step(tmp_path: Path) -> None:
    with RolloutWriter(tmp_path, "other") as w:
        with pytest.raises(ValueError, match="run_id"):
            w.write_step(0, [make_record(0, "p", 0)])
    with RolloutWriter(tmp_path, "r1") as w:
        with pytest.raises(ValueError, match="written as step 1"):
            w.write_step(1, [make_record(0, "p", 0)])


def test_temp_and_partial_files_are_ignored_by_reader(tmp_path: Path) -> None:
    with RolloutWriter(tmp_path, "r1") as w:
        w.write_step(0, [make_record(0, "p", 0)])
    rollouts = tmp_path / "rollouts"
    good = (rollouts / "step-00000000.parquet").read_bytes()
    # a crash mid-write leaves a temp file with half the bytes: it must be invisible
    temp_path_for(rollouts / "step-00000001.parquet").write_bytes(good[: len(good) // 2])
    reader = RolloutReader(tmp_path)
    assert reader.steps() == [0] and len(reader.index) == 1 and not reader.errors
    # a truncated file under a real shard name (copied by hand) is skipped and reported, not fatal
    (rollouts / "step-00000002.parquet").write_bytes(good[: len(good) // 2])
    assert reader.steps() == [0]
    assert any("step-00000002" in k for k in reader.errors)
    assert reader.refresh() is False  # a bad shard is not re-read until it changes
    assert len(remove_stale_temp_files(rollouts)) == 1


def test_reader_follows_a_run_that_is_writing(tmp_path: Path) -> None:
    w = RolloutWriter(tmp_path, "r1")
    w.write_step(0, [make_record(0, "p", i) for i in range(4)])
    w.flush()
    reader = RolloutReader(tmp_path)
    assert reader.steps() == [0]
    w.write_step(1, [make_record(1, "p", i) for i in range(4)])
    w.close()
    assert reader.refresh() is True
    assert reader.steps() == [0, 1] and len(reader.index) == 8
    assert reader.refresh() is False  # nothing new


class _Unstorable:
    def __repr__(self) -> str:
        return "<unstorable>"


def test_background_error_surfaces_on_next_call(tmp_path: Path) -> None:
    w = RolloutWriter(tmp_path, "r1")
    # make the shard path a folder: the background os.replace fails
    (tmp_path / "rollouts" / "step-00000005.parquet").mkdir()
    w.write_step(5, [make_record(5, "p", 0)])
    with pytest.raises(RolloutWriterError, match="step 5") as info:
        w.flush()
    assert isinstance(info.value.__cause__, OSError)
    # the writer keeps working for later steps, and close() is clean once the error was reported
    w.write_step(6, [make_record(6, "p", 0)])
    w.close()
    assert (tmp_path / "rollouts" / "step-00000006.parquet").is_file()
    assert not any(p.name.startswith(".") for p in (tmp_path / "rollouts").iterdir())


def test_background_error_surfaces_on_close(tmp_path: Path) -> None:
    w = RolloutWriter(tmp_path, "r1")
    (tmp_path / "rollouts" / "step-00000001.parquet").mkdir()
    w.write_step(1, [make_record(1, "p", 0)])
    with pytest.raises(RolloutWriterError):
        w.close()
    with pytest.raises(RolloutWriterError, match="after close"):
        w.write_step(2, [])


def test_background_error_surfaces_on_next_write_step(tmp_path: Path) -> None:
    w = RolloutWriter(tmp_path, "r1")
    (tmp_path / "rollouts" / "step-00000001.parquet").mkdir()
    w.write_step(1, [make_record(1, "p", 0)])
    w._queue.join()  # let the background thread fail (no public call, so nothing re-raises yet)
    with pytest.raises(RolloutWriterError, match="step 1"):
        w.write_step(2, [make_record(2, "p", 0)])
    w.close()


def test_atomic_helpers(tmp_path: Path) -> None:
    atomic_write_json(tmp_path / "a" / "x.json", {"b": 1, "a": [1.5]})
    assert json.loads((tmp_path / "a" / "x.json").read_text()) == {"a": [1.5], "b": 1}
    atomic_write_text(tmp_path / "a" / "x.json", "over")
    assert (tmp_path / "a" / "x.json").read_text() == "over"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.json"]


def _shape_image(seed: int) -> Image.Image:
    img = Image.new("RGB", (64, 48), "white")
    ImageDraw.Draw(img).rectangle([seed % 30, 5, seed % 30 + 20, 30], fill="red")
    return img


def test_image_store_content_addressed(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    a = store.put(_shape_image(1))
    assert a == store.put(_shape_image(1))  # same pixels -> same path
    b = store.put(_shape_image(2))
    assert a != b and a.startswith("images/") and a.endswith(".png")
    assert a.split("/")[1] == a.split("/")[2][:2]  # images/<ab>/<ab...>.png
    assert store.open(a).tobytes() == _shape_image(1).tobytes()
    # a second store object (e.g. after resume) finds the same file
    assert ImageStore(tmp_path).put(_shape_image(1)) == a


def test_image_store_concurrent_puts_of_same_image(tmp_path: Path) -> None:
    img = _shape_image(3)
    results: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        store = ImageStore(tmp_path)  # separate objects: no shared in-memory cache
        try:
            barrier.wait()
            results.append(store.put(img))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    files = [p for p in (tmp_path / "images").rglob("*") if p.is_file()]
    assert [p.name for p in files] == [Path(results[0]).name]  # no temp files left behind
    with Image.open(files[0]) as back:
        assert back.size == (64, 48)


def test_resolve_in_run_refuses_escape(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "images").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("s")
    assert resolve_in_run(run, "images/x.png") == (run / "images" / "x.png").resolve()
    for bad in ["../secret.txt", "../../etc/passwd", "/etc/passwd", "images/../../secret.txt", ""]:
        with pytest.raises(UnsafePathError):
            resolve_in_run(run, bad)
    os.symlink(tmp_path / "secret.txt", run / "images" / "link.png")
    with pytest.raises(UnsafePathError):
        resolve_in_run(run, "images/link.png")


def test_filter_and_groups(tmp_path: Path) -> None:
    with RolloutWriter(tmp_path, "r1") as w:
        for step in range(3):
            recs = []
            for g in range(2):
                for i in range(4):
                    # group p0: rewards 0,1,0,1 (mixed); group p1: all 1.0 (zero variance)
                    r = float(i % 2) if g == 0 else 1.0
                    adv = (r - 0.5) * 2 if g == 0 else 0.0
                    recs.append(make_record(step, f"p{g}", i, reward=r, adv=adv,
                                            components={"format": 1.0, "accuracy": r},
                                            finish="length" if i == 3 else "stop",
                                            text=f"answer {step}-{g}-{i}"))
            w.write_step(step, recs)
    reader = RolloutReader(tmp_path)
    assert reader.components() == ["accuracy", "format"]
    assert len(reader.filter()) == 24
    assert len(reader.filter(step_range=(1, 2))) == 16
    # rewards >= 0.5: p1 all 4 + p0 samples 1,3 -> 6 per step
    assert len(reader.filter(reward_range=(0.5, None))) == 18
    assert len(reader.filter(component="accuracy", passed=False)) == 6  # p0 samples 0,2 x 3 steps
    assert len(reader.filter(advantage_sign="+")) == 6
    assert len(reader.filter(advantage_sign="0")) == 12
    assert len(reader.filter(finish_reason="length")) == 6
    hits = reader.filter(regex=r"answer 2-1-\d")
    assert sorted(hits["sample_index"]) == [0, 1, 2, 3] and set(hits["step"]) == {2}
    assert len(reader.filter(limit=5)) == 5
    rr = reader.filter(order="round_robin")
    # first 6 rows: sample 0 of each of the 6 (step, prompt) groups
    assert list(rr["sample_index"].iloc[:6]) == [0] * 6 and rr.iloc[:6][["step", "prompt_id"]].drop_duplicates().shape[0] == 6
    groups = reader.groups(0)
    assert list(groups["zero_variance"]) == [False, True]
    # p0 rewards 0,1,0,1: mean 0.5, population std 0.5, spread 1
    assert groups["reward_std"].iloc[0] == pytest.approx(0.5) and groups["spread"].iloc[0] == 1.0
    with pytest.raises(UserError, match="unknown reward component 'nope'"):
        reader.filter(component="nope")
    with pytest.raises(UserError, match="invalid regular expression"):
        reader.filter(regex="(")
    recs = reader.records(reader.filter(step_range=(1, 1), advantage_sign="-"))
    assert [(r.step, r.prompt_id, r.sample_index) for r in recs] == [(1, "p0", 0), (1, "p0", 2)]
    hist = reader.prompt_history("p0")
    assert list(hist["step"]) == [0, 1, 2] and list(hist["reward_mean"]) == [0.5, 0.5, 0.5]


def test_nan_components_fall_back_to_python_json(tmp_path: Path) -> None:
    with RolloutWriter(tmp_path, "r1") as w:
        w.write_step(0, [make_record(0, "p", 0, components={"iou": float("nan"), "format": 1.0}),
                         make_record(0, "p", 1, components={"format": 0.0})])
    idx = RolloutReader(tmp_path).index
    assert math.isnan(idx["c:iou"].iloc[0]) and math.isnan(idx["c:iou"].iloc[1])
    assert list(idx["c:format"]) == [1.0, 0.0]


def test_metrics_partial_last_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 0.5}\n{"step": 1, "rew')
    reader = RolloutReader(tmp_path)
    assert reader.metrics() == [{"step": 0, "reward/mean": 0.5}]


def test_missing_run_dir_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        RolloutReader(tmp_path / "nope")


def test_loose_struct_values_are_coerced_not_fatal(tmp_path: Path) -> None:
    rec = make_record(0, "p", 0)
    rec.ground_truth = 3  # type: ignore[assignment]
    rec.rubric_results = [{"id": 7, "text": "t", "verdict": "pass", "score": True, "weight": "heavy",
                           "rationale": None, "judge": "j", "tokens_used": 12}]
    rec.consistency = {"verdict": "consistent", "p_consistent": "0.5", "conclusion_span": (3, 5, 9),
                       "thinking_correct": 1, "answer_correct": "yes", "raw": "ignored"}
    with RolloutWriter(tmp_path, "r1") as w:
        w.write_step(0, [rec])
    back = RolloutReader(tmp_path).read_step(0)[0]
    assert back.ground_truth == "3"
    assert back.rubric_results == [{"id": "7", "text": "t", "category": None, "verdict": "pass", "score": 1.0,
                                    "weight": None, "rationale": None, "judge": "j"}]
    assert back.consistency == {"verdict": "consistent", "p_consistent": 0.5, "conclusion": None,
                                "conclusion_span": None, "thinking_correct": True, "answer_correct": None}
