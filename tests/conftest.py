"""Shared test set-up: offline, quiet, single-threaded (CI has 2 cores shared by everything)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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

MAX_WORKERS = 4  # parallel test processes: each holds a few tiny models; more than 4 buys little here


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most MAX_WORKERS."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def pytest_sessionstart(session):
    """Full suite under xdist (plain ``pytest``, no paths given): start the PREBUILD builds, one thread each."""
    config = session.config
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
        # files with a slow (minutes-long) test go first, so the parallel workers start them early and end
        # together, instead of one worker running the last learning check while the others idle; the order
        # inside a file is kept (and it is the same on every worker, as xdist requires)
        slow_files = {item.fspath for item in items if "slow" in item.keywords}
        items.sort(key=lambda item: item.fspath not in slow_files)
