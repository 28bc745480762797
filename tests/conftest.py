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

import pytest  # noqa: E402

MAX_WORKERS = 4  # parallel test processes: each holds a few tiny models; more than 4 buys little here


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most MAX_WORKERS."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


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
