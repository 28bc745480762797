"""Rollout records of video prompts carry the stored frames and their sampling fps (the inspector times frames)."""

from mmrlvr.data.loading import rows_to_samples
from mmrlvr.data.synth_video import make_video_rows
from mmrlvr.inspector import views
from mmrlvr.store.images import VIDEO_FPS_KEY, VIDEO_FRAMES_KEY, ImageStore
from mmrlvr.store.record import RolloutRecord
from mmrlvr.train.records import _video_extra


def test_video_extra_records_frames_and_fps(tmp_path):
    sample = rows_to_samples(make_video_rows("video_count", "train", 1))[0]
    fps = sample.meta["videos"][0]["fps"]
    extra = _video_extra(sample, ImageStore(tmp_path).put)
    assert len(extra[VIDEO_FRAMES_KEY]) == 1 and len(extra[VIDEO_FRAMES_KEY][0]) == len(sample.meta["videos"][0]["frames"])
    assert extra[VIDEO_FPS_KEY] == [float(fps)] and fps > 0
    # what the inspector reads back from such a record: the fps, hence each frame's time in the clip
    rec = RolloutRecord(run_id="r", step=1, prompt_id="p", sample_index=0, group_size=1, extra=extra)
    assert views.video_fps(rec, 1) == [float(fps)]


def test_video_extra_without_fps_says_none(tmp_path):
    sample = rows_to_samples(make_video_rows("video_count", "train", 1))[0]
    sample.meta["videos"][0].pop("fps")
    assert _video_extra(sample, ImageStore(tmp_path).put)[VIDEO_FPS_KEY] == [None]
