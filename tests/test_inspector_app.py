"""The launched inspector: every API endpoint through gradio_client, file serving over real HTTP, CLI."""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from gradio_client import Client  # noqa: E402

from mmrlvr.errors import UserError  # noqa: E402
from mmrlvr.inspector import cli  # noqa: E402
from mmrlvr.inspector.app import build_app, launch  # noqa: E402
from mmrlvr.store import RolloutReader, RolloutWriter  # noqa: E402
from mmrlvr.testing.fake_run import HOSTILE_TEXT, make_fake_run  # noqa: E402

# outputs of every Browse event, in order (see mmrlvr.inspector.app._Browse.outputs)
(STEP, GROUP, SAMPLE_RADIO, SAMPLE, CARDS, PROMPT, ANNOTATED, GALLERY, COMPARE, SLIDER, TA, REWARD, HEAT, HEAT_HTML,
 SIGNAL, FRAMES) = range(16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, Path]]:
    run = make_fake_run(tmp_path_factory.mktemp("runs") / "demo", steps=3, groups=4, group_size=4,
                        include_hostile=True)
    app = build_app(run, refresh_s=3600)
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield app, url, run
    finally:
        app.close()


@pytest.fixture()
def client(served: tuple[Any, str, Path]) -> Client:
    return Client(served[1], verbose=False)


def value(update: Any) -> Any:
    return update["value"] if isinstance(update, dict) and "__type__" in update else update


def test_launch_binds_loopback_only(served: tuple[Any, str, Path]) -> None:
    app, url, _ = served
    assert url.startswith("http://127.0.0.1:") and app.server_name == "127.0.0.1"


def test_every_endpoint_is_named(client: Client) -> None:
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert names == {"/render", "/select_step", "/select_group", "/select_sample", "/next_sample", "/prev_sample",
                     "/next_group", "/prev_group", "/heatmap", "/compare", "/refresh", "/filter", "/history",
                     "/metrics", "/goto_step", "/analysis"}


def test_render_defaults_to_last_step_best_sample(client: Client, served: tuple[Any, str, Path]) -> None:
    out = client.predict(None, None, None, "entropy", None, api_name="/render")
    reader = RolloutReader(served[2])
    assert value(out[STEP]) == 2 and value(out[GROUP]) == "p00000"
    best = max(reader.group(2, "p00000"), key=lambda r: (r.reward, -r.sample_index))
    assert value(out[SAMPLE]) == best.sample_index
    assert "mm-card" in out[CARDS] and "How many" in out[PROMPT]
    assert value(out[COMPARE]) == 1  # compare with the previous step by default
    assert len(out[SLIDER]) == 2 and all(Path(p).is_file() for p in out[SLIDER])
    assert [t["token"] for t in value(out[HEAT])] == best.response_tokens
    assert all(-1 <= t["class_or_confidence"] <= 1 for t in value(out[HEAT]))
    assert value(out[SIGNAL]) == "entropy" and out[HEAT]["label"].startswith("entropy per token")


def test_select_step_group_and_sample(client: Client) -> None:
    out = client.predict(0, "vision sensitivity", api_name="/select_step")
    assert value(out[STEP]) == 0
    out = client.predict(0, "p00001", "logprob", api_name="/select_group")
    assert value(out[GROUP]) == "p00001"
    ann = value(out[ANNOTATED])
    labels = [a["label"] for a in ann["annotations"]]
    assert any(lbl.startswith("pred 1 IoU ") for lbl in labels) and "gt 1" in labels
    assert Path(ann["image"]["path"] if isinstance(ann["image"], dict) else ann["image"]).is_file()
    out = client.predict(0, "p00000", 1, "entropy", None, api_name="/select_sample")
    assert value(out[SAMPLE]) == 1
    # the hostile response arrives escaped in the HTML panes and as plain tokens in the heatmap
    assert "<script" not in out[TA] and "&lt;script&gt;" in out[TA]
    assert "".join(t["token"] for t in value(out[HEAT])) == HOSTILE_TEXT


def test_next_and_previous_sample_and_group(client: Client, served: tuple[Any, str, Path]) -> None:
    reader = RolloutReader(served[2])
    order = [r.sample_index for r in sorted(reader.group(1, "p00002"), key=lambda r: (-r.reward, r.sample_index))]
    out = client.predict(1, "p00002", order[0], "ratio", api_name="/next_sample")
    assert value(out[SAMPLE]) == order[1]
    out = client.predict(1, "p00002", order[0], "ratio", api_name="/prev_sample")
    assert value(out[SAMPLE]) == order[-1]  # wraps around
    out = client.predict(1, "p00002", order[0], "ratio", api_name="/next_group")
    assert value(out[GROUP]) == "p00003"
    out = client.predict(1, "p00000", 0, "ratio", api_name="/prev_group")
    assert value(out[GROUP]) == "p00003"


def test_heatmap_and_compare(client: Client, served: tuple[Any, str, Path]) -> None:
    rec = RolloutReader(served[2]).record(2, "p00001", 3)
    heat, hover = client.predict(2, "p00001", 3, "credit weight", api_name="/heatmap")
    # credit weights are 0/1 with peak 1: the scores are the weights themselves
    assert [t["class_or_confidence"] for t in value(heat)] == rec.token_credit_weight
    assert "credit weight 1" in hover and 'class="mm-tok"' in hover
    pair = client.predict(2, "p00001", 3, 0, api_name="/compare")
    assert len(pair) == 2 and all(Path(p).is_file() for p in pair)


def test_filter_endpoint(client: Client, served: tuple[Any, str, Path]) -> None:
    reader = RolloutReader(served[2])
    expected = reader.filter(step_range=(1, 2), reward_range=(0.5, None), advantage_sign="+")
    count, table = client.predict("1", "2", "0.5", "", "(any)", "(any)", "+", [], "", "round robin", 200,
                                  api_name="/filter")
    assert count.startswith(f"{len(expected)} rollouts match")
    rows = table["data"]
    assert len(rows) == len(expected) and all(1 <= r[0] <= 2 and r[3] >= 0.5 and r[4] > 0 for r in rows)
    count, table = client.predict("", "", "", "", "(any)", "(any)", "(any)", [], r"onerror=alert",
                                  "step order", 10, api_name="/filter")
    assert count.startswith("1 rollouts match") and table["data"][0][:3] == [0, "p00000", 1]
    with pytest.raises(Exception, match="invalid regular expression"):
        client.predict("", "", "", "", "(any)", "(any)", "(any)", [], "(", "step order", 10,
                       api_name="/filter")


def test_history_metrics_and_goto(client: Client) -> None:
    title, table, plot = client.predict("p00001", api_name="/history")
    assert "p00001" in title and [r[0] for r in table["data"]] == [0, 1, 2]
    plots = client.predict(["reward/mean", "accuracy"], api_name="/metrics")
    assert len(plots) == 6
    first = value(plots[0])
    assert len(first["data"]) == 3  # one point per step
    out = client.predict(1.4, "entropy", api_name="/goto_step")
    assert value(out[STEP]) == 1  # nearest step to 1.4


def test_refresh_picks_up_a_new_step(served: tuple[Any, str, Path]) -> None:
    app, url, run = served
    client = Client(url, verbose=False)
    records = RolloutReader(run).read_step(2)
    for r in records:
        r.step = 3
    try:
        with RolloutWriter(run, "demo") as w:
            w.write_step(3, records)
        header, steps, _, _ = client.predict(2, api_name="/refresh")
        assert "4 step files" in header
        assert [c[1] for c in steps["choices"]] == [0, 1, 2, 3] and steps["value"] == 2
    finally:
        (run / "rollouts" / "step-00000003.parquet").unlink()
        app.inspector.reader.refresh()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_http_serves_only_the_run_folder(served: tuple[Any, str, Path], tmp_path: Path) -> None:
    _, url, run = served
    base = url.rstrip("/") + "/gradio_api/file="
    image = next((run / "images").rglob("*.png"))
    status, body = _get(base + str(image))
    assert status == 200 and body[:4] == b"\x89PNG"
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    repo_file = Path(__file__).resolve()  # inside the working directory, but not in the run
    link = run / "images" / "link.txt"  # a symlink inside the run that leads out of it
    link.symlink_to(outside)
    for path in ["../../etc/passwd", "/etc/passwd", str(outside), str(repo_file), str(link),
                 str(run) + "/../../../etc/passwd", urllib.parse.quote("../../etc/passwd", safe="")]:
        status, body = _get(base + path)
        assert status in (403, 404), (path, status)
        assert b"secret" not in body and b"root:" not in body
    link.unlink()


def test_cli_validates_arguments(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        cli.main([str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="does not look like a run folder"):
        cli.main([str(tmp_path / "empty")])
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2)
    with pytest.raises(UserError, match="--port"):
        cli.main([str(run), "--port", "0"])
    args = cli.parse_args([str(run)])
    assert (args.host, args.port) == ("127.0.0.1", 7860)


def test_cli_dispatch_reports_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mmrlvr.cli import main

    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "mmrlvr inspect: error: run folder" in capsys.readouterr().err


def test_render_falls_back_to_a_recorded_signal(tmp_path: Path) -> None:
    from mmrlvr.inspector.app import Inspector
    from mmrlvr.store import RolloutRecord

    recs = [RolloutRecord(run_id="r", step=0, prompt_id="p", sample_index=i, group_size=2, response_text="ab",
                          response_token_ids=[1, 2], response_tokens=["a", "b"], token_logprob=[-1.0, -0.5],
                          reward=float(i)) for i in range(2)]
    with RolloutWriter(tmp_path, "r") as w:
        w.write_step(0, recs)
    ins = Inspector(tmp_path)
    out = ins.render(None, None, None, "vision sensitivity")
    # only log-probs were recorded: the heatmap switches to them (peak |-1| -> scores -1, -0.5)
    assert out[SIGNAL]["value"] == "logprob" and [(t["token"], t["class_or_confidence"]) for t in out[HEAT].value] == [
        ("a", -1.0), ("b", -0.5)]
    heat, hover = ins.heatmap(0, "p", 1, "entropy")
    assert "not recorded" in heat.label and "not recorded" in hover
    # no images in this run: the image panel is empty rather than an error
    assert out[ANNOTATED].value is None and out[SLIDER] is None
    assert out[FRAMES]["visible"] is False  # and no video: no frame strip


def test_render_shows_a_video_prompts_frames_and_image_rows_as_before(tmp_path: Path) -> None:
    from mmrlvr.inspector.app import BROWSE_OUTPUTS, Inspector

    run = make_fake_run(tmp_path / "run", steps=2, groups=2, group_size=2, video_groups=1, video_frames=6)
    ins = Inspector(run)
    out = ins.render(1, "v00000", None, "entropy")
    assert len(out) == BROWSE_OUTPUTS
    assert out[FRAMES]["visible"] is True and "video: 6 frames" in out[FRAMES]["value"]
    assert out[FRAMES]["value"].count("<img ") == 6
    assert out[ANNOTATED].visible is False  # no prompt image: the strip stands in its place
    left, right = out[SLIDER]  # the compare slider shows the frames as one sheet per step
    assert left.size == right.size == (4 * 96, 2 * 96 + 14)
    out = ins.render(1, "p00001", None, "entropy")
    assert out[FRAMES]["visible"] is False and out[FRAMES]["value"] == ""
    assert out[ANNOTATED].visible is True and out[ANNOTATED].value is not None


# -- exposure: a non-loopback host needs a login or an explicit --insecure; only images/rollouts served ------
def test_cli_refuses_an_exposed_host_without_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2)
    monkeypatch.delenv(cli.AUTH_ENV, raising=False)
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.org"):
        with pytest.raises(UserError, match="--auth USER:PASS"):
            cli.main([str(run), "--host", host])
    for bad in ("user", "user:", ":pass", ""):
        with pytest.raises(UserError, match="USER:PASS"):
            cli.main([str(run), "--host", "0.0.0.0", "--auth", bad])
    assert all(cli.is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost", "[::1]"))
    assert cli.parse_auth("ann:p:w") == ("ann", "p:w")  # the password may hold ':'


def test_cli_exposed_host_warns_and_passes_the_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from mmrlvr.inspector import app as inspector_app

    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(inspector_app, "launch", lambda app, **kw: calls.append(kw))
    monkeypatch.delenv(cli.AUTH_ENV, raising=False)
    assert cli.main([str(run), "--host", "0.0.0.0", "--auth", "ann:s3cret"]) == 0
    assert calls[-1]["auth"] == ("ann", "s3cret") and calls[-1]["host"] == "0.0.0.0"
    err = capsys.readouterr().err
    assert "WARNING" in err and "0.0.0.0" in err and "login required" in err and "s3cret" not in err
    assert cli.main([str(run), "--host", "0.0.0.0", "--insecure"]) == 0
    assert calls[-1]["auth"] is None and "NO login" in capsys.readouterr().err
    monkeypatch.setenv(cli.AUTH_ENV, "bob:pw")
    assert cli.main([str(run), "--host", "10.0.0.1"]) == 0 and calls[-1]["auth"] == ("bob", "pw")
    assert "WARNING" in capsys.readouterr().err
    monkeypatch.delenv(cli.AUTH_ENV)
    assert cli.main([str(run)]) == 0  # loopback: no warning, no login needed
    assert calls[-1]["auth"] is None and calls[-1]["host"] == "127.0.0.1" and "WARNING" not in capsys.readouterr().err


def test_server_serves_images_and_rollouts_never_config_or_checkpoints(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2)
    (run / "config.yaml").write_text("rubric:\n  judge_params: {api_key: sk-SECRET}\n")
    ckpt = run / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"SECRET-WEIGHTS")
    (run / "metrics.jsonl").write_text('{"step": 0, "note": "SECRET"}\n')
    (run / "images" / "cfg-link.yaml").symlink_to(run / "config.yaml")  # a link inside a served folder
    app = build_app(run, refresh_s=3600)
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        base = url.rstrip("/") + "/gradio_api/file="
        image = next((run / "images").rglob("*.png"))
        shard = next((run / "rollouts").glob("step-*.parquet"))
        for served in (image, shard):
            status, body = _get(base + str(served))
            assert status == 200 and len(body) == served.stat().st_size, served
        for hidden in (run / "config.yaml", ckpt / "model.safetensors", run / "metrics.jsonl",
                       run / "images" / "cfg-link.yaml", run / "images" / ".." / "config.yaml"):
            status, body = _get(base + str(hidden))
            assert status in (403, 404), (hidden, status)
            assert b"SECRET" not in body
    finally:
        app.close()


def test_launch_with_auth_requires_the_login(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2)
    app = build_app(run, refresh_s=3600)
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True, auth=("ann", "pw"))
    try:
        with pytest.raises(Exception):
            Client(url, verbose=False)  # no login: the API is closed
        client = Client(url, verbose=False, auth=("ann", "pw"))
        out = client.predict(None, None, None, "entropy", None, api_name="/render")
        assert value(out[STEP]) == 0
        image = next((run / "images").rglob("*.png"))
        status, _ = _get(url.rstrip("/") + "/gradio_api/file=" + str(image))
        assert status in (401, 403)  # files too need the login
    finally:
        app.close()


def test_follow_timer_opens_new_steps_only_from_the_newest(tmp_path: Path) -> None:
    from mmrlvr.inspector.app import Inspector

    source = make_fake_run(tmp_path / "source", steps=4, groups=2, group_size=2)
    reader = RolloutReader(source)
    run = tmp_path / "live"
    (run / "rollouts").mkdir(parents=True)
    ins = Inspector(run)
    assert "No rollouts yet" in ins.render(None, None, None)[CARDS]
    assert all(v == gr_skip() for v in ins.tick(None))  # nothing new: every output skipped

    def write(step: int) -> None:
        with RolloutWriter(run, "source") as w:
            w.write_step(step, reader.read_step(step))

    write(0)
    out = ins.tick(None)  # the empty view opens the first step
    assert out[3 + STEP]["value"] == 0 and "mm-card" in out[3 + CARDS] and "1 step files" in out[0]
    write(1)
    out = ins.tick(0)  # the newest step was shown: follow to step 1
    assert out[3 + STEP]["value"] == 1 and "step 1" in out[3 + CARDS]
    write(2)
    out = ins.tick(0)  # reading an older step: stay there, only the choices grow
    assert out[3 + STEP]["value"] == 0 and [c[1] for c in out[3 + STEP]["choices"]] == [0, 1, 2]
    assert out[3 + CARDS] == gr_skip()


def gr_skip() -> Any:
    import gradio as gr

    return gr.skip()


def test_the_analysis_endpoint_returns_the_runs_analyses(client: Client, served: tuple[Any, str, Path]) -> None:
    out = client.predict(api_name="/analysis")
    assert "mmrlvr analyze" in out or "<section>" in out  # no analysis/ yet: the hint; else its sections
