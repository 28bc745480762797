"""math-verify behind the accuracy reward: correct on any thread, bounded in time, never raising.

``(x+1)^{5000}`` against ``(x+2)^{5000}`` is a real input on which math-verify's symbolic comparison runs
far past any sensible budget (measured here: it hits a 2 s timeout), so it stands in for a hostile answer.
"""

from __future__ import annotations

import faulthandler
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from mmrlvr.rewards import AccuracyReward, math_equal
from mmrlvr.rewards.mathverify import _Worker
from mmrlvr.types import Sample

SLOW_PRED, SLOW_GOLD = "(x+1)^{5000}", "(x+2)^{5000}"


def sample(answer):
    return Sample(id="m", messages=[], images=[], answer=answer, answer_type="math")


def r1(answer):
    return f"<think>work</think><answer>{answer}</answer>"


PAIRS = [("\\sqrt{12}", "2\\sqrt{3}", 1.0), ("\\frac{\\pi}{2}", "\\pi/2", 1.0), ("x^2+2x+1", "(x+1)^2", 1.0),
         ("\\sqrt{11}", "2\\sqrt{3}", 0.0)]


def test_accuracy_on_worker_threads_matches_the_main_thread():
    acc = AccuracyReward()
    on_main = [acc(r1(p), sample(g)).score for p, g, _ in PAIRS]
    with ThreadPoolExecutor(max_workers=3) as pool:
        off_main = list(pool.map(lambda pg: acc(r1(pg[0]), sample(pg[1])).score, PAIRS))
    assert on_main == off_main == [want for _, _, want in PAIRS]
    assert acc.errors == 0


def test_timeout_on_the_main_thread_scores_zero_and_is_counted():
    acc = AccuracyReward(timeout_s=1)
    t0 = time.monotonic()
    r = acc(r1(SLOW_PRED), sample(SLOW_GOLD))
    elapsed = time.monotonic() - t0
    assert r.score == 0.0 and r.parsed["error"].startswith("timeout") and acc.errors == 1
    assert elapsed < 6  # each math-verify step is capped at 1 s


def test_timeout_off_the_main_thread_scores_zero_and_the_next_call_still_works():
    acc = AccuracyReward(timeout_s=1)
    results = {}

    def work():
        results["slow"] = acc(r1(SLOW_PRED), sample(SLOW_GOLD))
        results["fast"] = acc(r1("\\sqrt{12}"), sample("2\\sqrt{3}"))

    t0 = time.monotonic()
    th = threading.Thread(target=work)
    th.start()
    th.join(timeout=60)
    assert not th.is_alive()
    assert time.monotonic() - t0 < 20
    assert results["slow"].score == 0.0 and results["slow"].parsed["error"].startswith("timeout")
    assert results["fast"].score == 1.0 and acc.errors == 1


def test_a_worker_that_misses_its_deadline_is_killed_and_restarted():
    worker = _Worker()
    try:
        assert worker.compare("0.5", "\\frac{1}{2}", 5, 6, deadline_s=30).equal  # started and warm
        pid = worker._proc.pid
        t0 = time.monotonic()
        v = worker.compare(SLOW_PRED, SLOW_GOLD, 5, 6, deadline_s=0.5)  # math-verify would take 5 s per step
        assert time.monotonic() - t0 < 3
        assert not v.equal and "restarted" in v.error and worker.restarts == 1
        assert worker._proc is None  # the hung process is gone
        assert worker.compare("\\sqrt{12}", "2\\sqrt{3}", 5, 6, deadline_s=30).equal
        assert worker._proc.pid != pid
    finally:
        worker.kill()


def test_inline_isolation_off_the_main_thread_reports_instead_of_raising():
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("v", math_equal("1", "1.0", isolation="inline")))
    th.start()
    th.join()
    assert not out["v"].equal and "main thread" in out["v"].error


def test_process_isolation_on_the_main_thread():
    assert math_equal("\\frac{6}{4}", "1.5", isolation="process").equal
    assert not math_equal("\\frac{6}{4}", "1.6", isolation="process").equal


def test_a_timeout_swallowed_where_python_discards_exceptions_fires_again(monkeypatch):
    """The alarm's exception can land in a weakref callback or ``__del__``, where Python only prints it.

    A parse that swallows the first timeout (as such a callback does) and then runs on must still be cut
    off: the deadline fires again until its exception reaches the call.
    """
    import signal

    import math_verify

    from mmrlvr.rewards.mathverify import compare_inline

    swallowed = []

    def parse_that_loses_the_first_alarm(*args, **kwargs):
        try:
            while True:
                sum(range(1000))
        except BaseException as e:  # noqa: BLE001 - what Python does to an exception raised in a finalizer
            swallowed.append(type(e).__name__)
        while True:  # runs on, unbounded, unless the deadline fires again
            sum(range(1000))

    monkeypatch.setattr(math_verify, "parse", parse_that_loses_the_first_alarm)
    previous = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    faulthandler.dump_traceback_later(30, exit=True)  # a one-shot alarm hangs here forever: fail, not hang
    try:
        v = compare_inline("1", "never-cached-gold", timeout_s=1)
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert not v.equal and v.error.startswith("timeout")
    assert swallowed == ["TimeoutException"]
    assert time.monotonic() - t0 < 3
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # nothing left armed for the caller
    assert signal.getsignal(signal.SIGALRM) is previous


def test_a_comparison_that_finishes_leaves_no_alarm_behind():
    import signal

    from mmrlvr.rewards.mathverify import compare_inline

    previous = signal.getsignal(signal.SIGALRM)
    assert compare_inline("\\frac{1}{2}", "0.5", timeout_s=1).equal
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is previous
    time.sleep(1.5)  # past the deadline: no stray exception arrives
