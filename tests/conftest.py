"""Shared test set-up: offline, quiet, single-threaded (CI has 2 cores shared by everything)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# a step metric that does not declare how several processes combine it is an error here (mmrlvr.metric), in this
# process and in the runs it starts (goldens, torchrun matrices)
os.environ.setdefault("MMRLVR_STRICT_METRICS", "1")
# One model cache per checkout: the warm-started tiny VLM is built once (by the first test that needs it)
# and reused by the others; a fresh clone (CI) builds it from scratch.
os.environ.setdefault("MMRLVR_CACHE", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                   ".cache", "mmrlvr"))

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

#: tiny models the suite trains from, put in the cache in the background at the start of a full parallel run (the
#: warm starts are copied from the package's shipped ones; a changed recipe builds) so the workers run the unit
#: tests meanwhile instead of waiting, one core idle, for a test that needs one
#: (a worker that needs one before it is ready waits on the cache folder's lock: mmrlvr.train.model_path)
PREBUILD = ("tiny:qwen2_5_vl:warm", "tiny:qwen2_5_vl:warm:noise0.9", "tiny:qwen2_5_vl:warm:grounding_single",
            "tiny:qwen3_vl")
_builders: list[subprocess.Popen] = []
_recorder = None  # tests.file_times.Recorder under --record-file-times

MAX_WORKERS = 4  # parallel test processes: each holds a few tiny models; more than 4 buys little here


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most MAX_WORKERS."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def pytest_sessionstart(session):
    """Full suite under xdist (plain ``pytest``, no paths given): start the PREBUILD builds, one thread each."""
    global _recorder
    config = session.config
    if config.getoption("record_file_times") and not hasattr(config, "workerinput"):
        from tests.file_times import Recorder

        _recorder = Recorder()
    if hasattr(config, "workerinput") or not config.pluginmanager.has_plugin("dsession"):
        return  # a worker, or a serial run
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return  # a few tests picked by hand: build only what they need, when they need it
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = "import sys; from mmrlvr.train.model_path import resolve_model_path; resolve_model_path(sys.argv[1])"
    for spec in PREBUILD:
        _builders.append(subprocess.Popen([sys.executable, "-c", code, spec], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))


def pytest_sessionfinish(session, exitstatus):
    if _recorder is not None and _recorder.seconds:
        from pathlib import Path

        from tests.file_times import RECORD

        root = Path(str(session.config.rootpath))
        path = root / session.config.getoption("record_file_times")
        written = _recorder.write(path, existing=[p.relative_to(root).as_posix()
                                                  for p in RECORD.parents[1].glob("test_*.py")])
        print(f"\nfile times of {len(_recorder.seconds)} files written to {path} ({len(written)} recorded)")
    for proc in _builders:  # normally long done; an interrupted run must not leave builders behind
        if proc.poll() is None:
            proc.terminate()


def pytest_configure(config):
    """Under xdist, split the cores between workers: each worker's torch gets cores // workers threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # for the commands tests start (CLI, torchrun)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0) > 1:
        # the longest files go first (by tests/data/file_times.json), so the parallel workers end together instead
        # of one running the last long file while the others idle; the order inside a file is kept, and it is the
        # same on every worker, as xdist requires (tests/file_times.py)
        from tests.file_times import load_record, order_longest_first

        order_longest_first(items, load_record())


def pytest_addoption(parser):
    parser.addoption("--record-file-times", nargs="?", const="tests/data/file_times.json", default=None,
                     metavar="PATH", help="write each test file's seconds to PATH (default tests/data/file_times.json, "
                                          "by which the parallel suite hands out the longest files first)")


def pytest_runtest_logreport(report):
    """Under ``--record-file-times``, sum the seconds of each file's tests (in the process that writes reports:
    xdist's controller, or a serial run)."""
    if _recorder is not None:
        _recorder.add(report.nodeid, report.duration)


@pytest.fixture(autouse=True, scope="module")
def _registrations_stay_in_their_file():
    """What a test file registers at run time (a plug-in it loads, an estimator a test defines) is gone when the
    file ends, so the next file in this worker does not depend on which files ran before it (tests/registrations.py)."""
    from tests.registrations import Snapshot

    snapshot = Snapshot()
    yield
    snapshot.restore()
