"""Small datasets written in other frameworks' layouts (verl, EasyR1, VLM-R1, LLaVA, Visual-RFT), for tests.

Each writer makes 4 rows in ``folder`` and returns the data file's path. Images are tiny PNGs made here
(nothing downloaded, nothing binary committed); answers are counts of the coloured squares drawn, so the
rows are valid for the tiny VLM's rewards.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = [(220, 30, 30), (30, 30, 220), (30, 160, 30), (200, 200, 30)]


def png(n: int = 1, size: int = 56, colour=(220, 30, 30)) -> bytes:
    """A white PNG with ``n`` coloured squares."""
    im = Image.new("RGB", (size, size), (255, 255, 255))
    d = ImageDraw.Draw(im)
    for i in range(n):
        x = 4 + (i % 3) * 16
        y = 4 + (i // 3) * 16
        d.rectangle([x, y, x + 10, y + 10], fill=colour)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def write_verl(folder: Path, n: int = 4) -> Path:
    """verl's multimodal parquet: chat-list ``prompt`` with ``<image>``, ``images`` as {bytes, path} structs,
    ``reward_model.ground_truth``, ``extra_info.index``, ``data_source``, ``ability``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{
        "data_source": "count_squares",
        "prompt": [{"role": "system", "content": "You count things."},
                   {"role": "user", "content": "<image>How many squares are there?"}],
        "images": [{"bytes": png(i % 3 + 1), "path": None}],
        "ability": "counting",
        "reward_model": {"style": "rule", "ground_truth": str(i % 3 + 1)},
        "extra_info": {"split": "train", "index": 100 + i},
    } for i in range(n)]
    path = folder / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_easyr1(folder: Path, n: int = 4) -> Path:
    import datasets

    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image())})
    ds = datasets.Dataset.from_dict({
        "problem": ["<image>How many squares are there?"] * n,
        "answer": [str(i % 3 + 1) for i in range(n)],
        "images": [[{"bytes": png(i % 3 + 1), "path": None}] for i in range(n)],
    }, features=features)
    path = folder / "easyr1.parquet"
    ds.to_parquet(str(path))
    return path


def write_vlm_r1(folder: Path, n: int = 4) -> Path:
    """VLM-R1 JSONL: ``conversations`` (from/value), ``solution`` in ``<answer>`` tags, relative image paths."""
    (folder / "imgs").mkdir(exist_ok=True)
    lines = []
    for i in range(n):
        name = f"imgs/v{i}.png"
        (folder / name).write_bytes(png(i % 3 + 1))
        lines.append({"id": f"vlm-{i}", "image": name,
                      "conversations": [{"from": "human", "value": "<image>How many squares are there?"},
                                        {"from": "gpt", "value": "ignored when solution is set"}],
                      "solution": f"<answer> {i % 3 + 1} </answer>"})
    path = folder / "vlm_r1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def write_llava(folder: Path, n: int = 4) -> Path:
    """LLaVA JSON (a list): ``conversations`` human/gpt, the gpt turn is the answer; two images per row."""
    (folder / "imgs").mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        names = [f"imgs/l{i}a.png", f"imgs/l{i}b.png"]
        (folder / names[0]).write_bytes(png(i % 3 + 1))
        (folder / names[1]).write_bytes(png(1, colour=(30, 30, 220)))
        rows.append({"id": f"llava-{i}", "image": names,
                     "conversations": [{"from": "human", "value": "<image>\n<image>\nHow many red squares are in the "
                                                                   "first picture?"},
                                       {"from": "gpt", "value": str(i % 3 + 1)}]})
    path = folder / "llava.json"
    path.write_text(json.dumps(rows))
    return path


def write_visual_rft(folder: Path, n: int = 4) -> Path:
    """Visual-RFT detection JSONL: ``problem``, ``solution`` = ``<answer>[{'Position': [...], 'Confidence': 1}]</answer>``,
    the image as raw base64 text."""
    lines = []
    for i in range(n):
        k = i % 2 + 1
        boxes = [{"Position": [4 + j * 16, 4, 14 + j * 16, 14], "Confidence": 1} for j in range(k)]
        lines.append({"id": f"rft-{i}", "problem": "<image>Detect every red square. Output the boxes.",
                      "solution": f"<answer>{boxes!r}</answer>",
                      "image": base64.b64encode(png(k)).decode()})
    path = folder / "visual_rft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


WRITERS = {"verl": write_verl, "easyr1": write_easyr1, "vlm_r1": write_vlm_r1, "llava": write_llava,
           "visual_rft": write_visual_rft}
