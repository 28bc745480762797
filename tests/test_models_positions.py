"""``row_positions``: Qwen-VL's 3D rope positions, each row's computed once and reused, equal to the model's own
``compute_3d_position_ids`` on the whole batch for every family, sub-batch, padding and image count."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmrlvr.credit.signals import _images_per_row
from mmrlvr.models import positions

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_batch(request, tmp_path_factory):
    """A family's backbone and a batch: rows with 0, 1 and 2 images of different sizes, left-padded prompts,
    responses of different lengths (right padding), and two rows that are the same."""
    from transformers import AutoModelForImageTextToText

    from mmrlvr.models.compat import load_processor
    from mmrlvr.models.tiny import build_tiny

    family = request.param
    path = build_tiny(family, tmp_path_factory.mktemp(family) / "m")
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = load_processor(path, family)
    sizes = [[(56, 84)], [(112, 56), (56, 56)], [], [(84, 84)], [(56, 84)]]
    texts, images = [], []
    for i, row in enumerate(sizes):
        words = " are there" * (i % 4)  # row 4 asks what row 0 asks
        content = [{"type": "image"} for _ in row] + [{"type": "text", "text": "how many shapes" + words}]
        texts.append(processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True))
        images += [Image.new("RGB", s, (40 * i, 90, 200)) for s in row]
    enc = processor(text=texts, images=images, padding=True, padding_side="left", return_tensors="pt")
    n = len(texts)
    gen = torch.Generator().manual_seed(0)
    response = torch.randint(10, 200, (n, 6), generator=gen)
    response[4] = response[0]  # rows 0 and 4: the same prompt and response
    lengths = [6, 3, 1, 6, 6]
    rmask = torch.tensor([[1] * k + [0] * (6 - k) for k in lengths])
    batch = {"input_ids": torch.cat([enc["input_ids"], response], 1),
             "attention_mask": torch.cat([enc["attention_mask"], rmask], 1),
             "image_grid_thw": enc["image_grid_thw"]}
    if "mm_token_type_ids" in enc:
        batch["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(response)], 1)
    return model.model, batch


def _direct(backbone, b, rows):
    per_row = _images_per_row(backbone, b["input_ids"])
    starts = [0]
    for k in per_row:
        starts.append(starts[-1] + k)
    extra = {k: b[k][rows] for k in ("mm_token_type_ids",) if k in b}
    from mmrlvr.models.cache_arg import positions_cache_kwargs

    return backbone.compute_3d_position_ids(
        input_ids=b["input_ids"][rows], inputs_embeds=None, video_grid_thw=None, **positions_cache_kwargs(backbone),
        image_grid_thw=b["image_grid_thw"][[i for r in rows for i in range(starts[r], starts[r + 1])]],
        attention_mask=b["attention_mask"][rows], **extra)


def _cached(backbone, b, rows):
    extra = {k: b[k][rows] for k in ("mm_token_type_ids",) if k in b}
    per_row = _images_per_row(backbone, b["input_ids"])
    starts = [0]
    for k in per_row:
        starts.append(starts[-1] + k)
    grid = b["image_grid_thw"][[i for r in rows for i in range(starts[r], starts[r + 1])]]
    return positions.row_positions(backbone, b["input_ids"][rows], b["attention_mask"][rows], grid,
                                   [per_row[r] for r in rows], extra)


def test_rows_reused_across_sub_batches_equal_the_whole_batch(family_batch):
    backbone, b = family_batch
    positions.clear()
    whole = _direct(backbone, b, [0, 1, 2, 3, 4])
    assert whole is not None and whole.shape[0] == 3
    calls = []
    real = backbone.compute_3d_position_ids

    def counting(**kw):
        calls.append(kw["input_ids"].shape[0])
        return real(**kw)

    backbone.compute_3d_position_ids = counting
    try:
        for rows in ([1, 3], [0, 1, 2, 3, 4], [4, 2], [3, 0, 1]):
            got = _cached(backbone, b, rows)
            assert torch.equal(got, whole[:, rows]), rows
    finally:
        del backbone.compute_3d_position_ids
    # rows 1 and 3 first; then 0 and 2 (row 4 is row 0 again); nothing after that
    assert calls == [2, 2]


def test_a_small_cache_still_answers_every_row(family_batch, monkeypatch):
    backbone, b = family_batch
    positions.clear()
    monkeypatch.setattr(positions, "CACHE_BYTES", 1)  # keeps one row: every call computes the others again
    whole = _direct(backbone, b, [0, 1, 2, 3, 4])
    for _ in range(2):
        assert torch.equal(_cached(backbone, b, [0, 1, 2, 3, 4]), whole)
    assert len(positions._ROWS) == 1


def test_another_config_does_not_reuse_the_rows(family_batch):
    """The positions depend on the config (here the vision start token): rows are keyed by it too."""
    import copy

    backbone, b = family_batch
    positions.clear()
    _cached(backbone, b, [0, 1])
    other = copy.deepcopy(backbone)
    assert positions._config_key(other) == positions._config_key(backbone)  # a copy (the reference) shares them
    other.config.vision_config.spatial_merge_size = 1
    positions._CONFIG_KEYS.pop(other)
    assert positions._config_key(other) != positions._config_key(backbone)


def test_counts_that_do_not_add_up_are_computed_directly(family_batch):
    backbone, b = family_batch
    positions.clear()
    rows = [0, 1]
    got = positions.row_positions(backbone, b["input_ids"][rows], b["attention_mask"][rows],
                                  b["image_grid_thw"][:3], None, {k: b[k][rows] for k in ("mm_token_type_ids",) if k in b})
    assert torch.equal(got, _direct(backbone, b, rows)) and not positions._ROWS


# ------------------------------------------------------------------- generation: get_rope_index kept per row


def _model_of(backbone):
    """A stand-in for the model ``generate`` runs: ``cached_rope_index`` finds the backbone at ``.model``."""
    return torch.nn.ModuleDict({"model": backbone})


def _prompt_args(b, rows):
    per_row = [int(r) for r in ((b["mm_token_type_ids"] == 1) & ~torch.nn.functional.pad(
        b["mm_token_type_ids"] == 1, (1, 0))[:, :-1]).sum(dim=1)]
    starts = [0]
    for k in per_row:
        starts.append(starts[-1] + k)
    return dict(input_ids=b["input_ids"][rows], mm_token_type_ids=b["mm_token_type_ids"][rows],
                image_grid_thw=b["image_grid_thw"][[i for r in rows for i in range(starts[r], starts[r + 1])]],
                attention_mask=b["attention_mask"][rows])


def test_generations_rope_index_is_the_originals_and_computes_each_row_once(family_batch):
    """Inside ``cached_rope_index`` the backbone's ``get_rope_index`` returns the original's positions and deltas
    (values and dtypes) for rows with 0-2 images, left and right padding, in any order, called as ``generate``
    calls it (its other model inputs as keywords); the original sees each distinct row once; outside the block the
    method is the class's again."""
    backbone, b = family_batch
    if "mm_token_type_ids" not in b:
        pytest.skip("this processor gives no token types: the model computes its positions itself")
    positions.clear()
    seen: list[int] = []
    real = type(backbone).get_rope_index

    def counting(self, input_ids, **kw):
        seen.append(input_ids.shape[0])
        return real(self, input_ids, **kw)

    cls = type(backbone)
    cls.get_rope_index = counting
    try:
        expected = {tuple(rows): real(backbone, **_prompt_args(b, rows)) for rows in ([0, 1, 2, 3, 4], [3, 1], [4, 0])}
        seen.clear()
        with positions.cached_rope_index(_model_of(backbone)):
            assert "get_rope_index" in vars(backbone)
            for rows in ([3, 1], [0, 1, 2, 3, 4], [4, 0]):
                pos, deltas = backbone.get_rope_index(**_prompt_args(b, rows), pixel_values=None, use_cache=True)
                want_pos, want_deltas = expected[tuple(rows)]
                assert torch.equal(pos, want_pos) and pos.dtype == want_pos.dtype, rows
                assert torch.equal(deltas, want_deltas) and deltas.dtype == want_deltas.dtype, rows
                assert deltas.shape == want_deltas.shape == (len(rows), 1)
        assert "get_rope_index" not in vars(backbone)
    finally:
        cls.get_rope_index = real
    assert seen == [2, 2]  # rows 3 and 1, then 0 and 2 (row 4 is row 0); none after


def test_rows_the_cache_cannot_read_go_to_the_original(family_batch):
    """Video grids, a gap inside a row's attended tokens, missing token types: the original, unchanged."""
    backbone, b = family_batch
    if "mm_token_type_ids" not in b:
        pytest.skip("this processor gives no token types")
    positions.clear()
    args = _prompt_args(b, [0, 1, 2])
    gap = args["attention_mask"].clone()
    first = int(gap[0].nonzero()[0])
    gap[0, first + 1] = 0  # a hole after the row's first token
    with positions.cached_rope_index(_model_of(backbone)):
        got = backbone.get_rope_index(**{**args, "attention_mask": gap})
    want = type(backbone).get_rope_index(backbone, **{**args, "attention_mask": gap})
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and not positions._ROWS
    assert positions._image_runs(torch.tensor([[0, 2, 2, 0]]), torch.ones(1, 4, dtype=torch.long)) is None
    assert positions._image_runs(torch.tensor([[0, 1, 1, 0, 1, 0]]), torch.tensor([[0, 1, 1, 1, 1, 1]])) == [2]
    assert positions._image_runs(torch.tensor([[0, 1, 1, 0, 1, 0]]), torch.tensor([[1, 1, 1, 1, 0, 0]])) == [1]
    for gap in ([1, 1, 0, 1, 1, 1], [0, 1, 0, 1, 1, 1], [1, 0, 1, 0, 1, 1]):  # a hole, the row's first token attended or not
        assert positions._image_runs(torch.zeros(1, 6, dtype=torch.long), torch.tensor([gap])) is None, gap


def test_the_wrapper_is_removed_when_generation_raises(family_batch):
    backbone, _ = family_batch
    with pytest.raises(RuntimeError, match="boom"):
        with positions.cached_rope_index(_model_of(backbone)):
            raise RuntimeError("boom")
    assert "get_rope_index" not in vars(backbone)
