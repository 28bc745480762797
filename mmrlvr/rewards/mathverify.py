"""Math equivalence through math-verify, with timeouts that work on any thread and never crash a run.

math-verify (``math_verify.parse`` / ``verify``) bounds its own work with ``signal.alarm``, which only
works on the main thread of the main interpreter: called from a worker thread (a reward server, a
thread pool in the trainer, Gradio) with timeouts on, it raises ``ValueError``; with timeouts off
(``parsing_timeout=None``), a pathological expression such as ``(x+1)^{5000}`` against ``(x+2)^{5000}``
can run for minutes. So:

- on the main thread we call math-verify in-process under our own ``SIGALRM`` deadline (``isolation="inline"``,
  ``time_limit``): math-verify's one-shot ``signal.alarm`` is lost when its exception lands in a weakref
  callback or ``__del__`` (Python prints it as "Exception ignored" and carries on, unbounded), so ours
  fires again every ``REFIRE_S`` until the exception reaches the call;
- on any other thread we send the pair to a small worker *process* (``python -m mmrlvr.rewards._mv_worker``)
  where math-verify runs on that process's main thread under the same deadline, and we also wait with a
  deadline: a worker that does not answer in time is killed and restarted (``isolation="process"``).
  A hung thread cannot be killed in Python and would hold the GIL; a process can.

Every failure (timeout, exception, dead worker) is returned as ``MathVerdict.error`` instead of raised,
so the reward scores 0 and counts the error. Deliberately not here: extracting the answer from a response
(``mmrlvr.rewards.parsing``) and the plain-number fast path (``mmrlvr.rewards.accuracy``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

ISOLATIONS = ("auto", "inline", "process")


@dataclass(frozen=True)
class MathOptions:
    """math-verify's own comparison options, passed through unchanged (see ``math_verify.verify``).

    float_rounding: decimals floats are rounded to (math-verify default 6).
    numeric_precision: significant digits of numeric evaluation (default 15).
    strict: variables must match and sets are not tuples (default True); False matches variables by
        position and lets ``{1, 2}`` equal ``(1, 2)``.
    allow_set_relation_comp: compare a set with a relation (``(1, 2)`` vs ``1 < x < 2``) even when the
        prediction is not a set (default False).
    anchor: wrap a string without a math environment in ``\\boxed{}`` before ``parse`` (``wrap_for_parse``);
        False hands ``parse`` the raw string, as math-verify's README does with whole model outputs.
    """

    float_rounding: int = 6
    numeric_precision: int = 15
    strict: bool = True
    allow_set_relation_comp: bool = False
    anchor: bool = True


@dataclass
class MathVerdict:
    """equal: math-verify judged them equivalent. error: why the check failed (timeout, exception), else None.

    gold_parsed / pred_parsed: math-verify extracted a math expression (not just a string) from each side.
    """

    equal: bool
    error: str | None = None
    gold_parsed: bool = False
    pred_parsed: bool = False


class _QuietTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeouts are off; ours (``time_limit``) bound every call instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


logging.getLogger("math_verify").addFilter(_QuietTimeoutWarning())
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_QuietTimeoutWarning())


def wrap_for_parse(s: str) -> str:
    """Give math-verify an explicit LaTeX anchor so it parses the whole answer, not its last number.

    Unanchored, math-verify reads ``2\\sqrt{3}`` as 2 and ``(1, 2)`` as 2; inside ``\\boxed{}`` it reads
    ``2*sqrt(3)`` and an interval.

    >>> wrap_for_parse("2\\\\sqrt{3}")
    '\\\\boxed{2\\\\sqrt{3}}'
    >>> wrap_for_parse("$x=1$")
    '$x=1$'
    """
    if "$" in s or "\\boxed" in s or "\\(" in s or "\\[" in s:
        return s
    return "\\boxed{" + s + "}"


REFIRE_S = 0.2  # after the deadline, the alarm repeats this often until its exception escapes


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise ``math_verify.errors.TimeoutException`` in the body after ``seconds``; main thread only.

    Why not math-verify's own ``timeout_seconds``: it arms ``signal.alarm`` once. A signal's exception is
    raised in whatever Python code runs at that instant; if that is a weakref callback or a ``__del__``
    (sympy creates and drops many), Python reports it as unraisable and the comparison runs on with no
    bound. Ours is an interval timer: it fires again every ``REFIRE_S`` until the exception lands in the
    body. The exception is a ``BaseException`` so ``except Exception`` blocks in sympy cannot eat it either.
    """
    from math_verify.errors import TimeoutException

    armed = True

    def fire(signum: int, frame: Any) -> None:
        if armed:
            raise TimeoutException(f"math-verify took more than {seconds}s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, float(seconds), REFIRE_S)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_GOLD_CACHE: dict[tuple[str, bool], list[Any]] = {}
_GOLD_CACHE_MAX = 4096


def _is_math(parsed: list[Any]) -> bool:
    return any(not isinstance(x, str) for x in parsed)


def compare_inline(pred: str, gold: str, timeout_s: int = 5, float_rounding: int = 6,
                   options: MathOptions | None = None) -> MathVerdict:
    """math-verify in this thread, each parse and the comparison under ``time_limit`` (main thread only).

    Never raises.

    ``verify(parse(gold), parse(pred), **options)``, exactly as math-verify's README calls it (strings are
    anchored first unless ``options.anchor`` is False). ``float_rounding`` is kept for old callers; a
    given ``options`` wins.
    """
    opts = options if options is not None else MathOptions(float_rounding=float_rounding)
    prep = wrap_for_parse if opts.anchor else (lambda x: x)
    try:
        from math_verify import parse, verify
        from math_verify.errors import TimeoutException
    except ImportError as e:  # pragma: no cover - math-verify is a core dependency
        return MathVerdict(False, f"math-verify not importable: {e}")
    try:
        key = (gold, opts.anchor)
        g = _GOLD_CACHE.get(key)
        if g is None:
            with time_limit(timeout_s):
                g = parse(prep(gold), parsing_timeout=None, raise_on_error=True)
            if len(_GOLD_CACHE) >= _GOLD_CACHE_MAX:
                _GOLD_CACHE.clear()
            _GOLD_CACHE[key] = g
        with time_limit(timeout_s):
            p = parse(prep(pred), parsing_timeout=None, raise_on_error=True)
        verdict = MathVerdict(False, None, _is_math(g), _is_math(p))
        if not g or not p:
            return verdict
        with time_limit(timeout_s):
            verdict.equal = bool(
                verify(g, p, float_rounding=opts.float_rounding, numeric_precision=opts.numeric_precision,
                       strict=opts.strict, allow_set_relation_comp=opts.allow_set_relation_comp,
                       timeout_seconds=None, raise_on_error=True)
            )
        return verdict
    except TimeoutException:
        if signal.getitimer(signal.ITIMER_REAL)[1] == REFIRE_S:  # it landed in time_limit's own exit: disarm
            signal.setitimer(signal.ITIMER_REAL, 0)
        return MathVerdict(False, f"timeout: math-verify took more than {timeout_s}s")
    except Exception as e:  # noqa: BLE001 - any verifier failure scores 0 and is counted, never crashes
        return MathVerdict(False, f"{type(e).__name__}: {str(e)[:200]}")


class _Worker:
    """One ``python -m mmrlvr.rewards._mv_worker`` child answering JSON lines; restarted after a hang."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.restarts = 0

    def _start(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mmrlvr.rewards._mv_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        self._lines = queue.Queue()
        out, lines = self._proc.stdout, self._lines

        def pump() -> None:  # a reader thread lets us wait for a line with a deadline
            assert out is not None
            for line in out:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, name="mmrlvr-mathverify-reader", daemon=True).start()

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def compare(self, pred: str, gold: str, timeout_s: int, float_rounding: int, deadline_s: float,
                options: MathOptions | None = None) -> MathVerdict:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            assert self._proc is not None and self._proc.stdin is not None
            opts = options if options is not None else MathOptions(float_rounding=float_rounding)
            request = {"pred": pred, "gold": gold, "timeout_s": timeout_s, "float_rounding": float_rounding,
                       "options": opts.__dict__}
            try:
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
                line = self._lines.get(timeout=deadline_s)
            except queue.Empty:
                self.kill()
                self.restarts += 1
                return MathVerdict(False, f"timeout: math-verify worker gave no verdict in {deadline_s:.0f}s (restarted)")
            except OSError as e:
                self.kill()
                return MathVerdict(False, f"math-verify worker failed: {e}")
            if line is None:
                self.kill()
                return MathVerdict(False, "math-verify worker exited")
            try:
                return MathVerdict(**json.loads(line))
            except (ValueError, TypeError) as e:
                return MathVerdict(False, f"math-verify worker sent a bad reply: {e}")


_WORKER = _Worker()
atexit.register(_WORKER.kill)


def math_equal(pred: str, gold: str, timeout_s: int = 5, isolation: str = "auto", float_rounding: int = 6,
               options: MathOptions | None = None) -> MathVerdict:
    """Is ``pred`` mathematically equivalent to ``gold``? Safe on any thread; never raises.

    ``timeout_s`` bounds each math-verify parse and comparison (whole seconds: ``signal.alarm``).
    ``isolation``: "auto" (inline on the main thread, worker process elsewhere), "inline", "process".
    ``options``: math-verify's comparison options (``MathOptions``); default: its defaults with ``float_rounding``.

    >>> math_equal("0.5", "\\\\frac{1}{2}").equal
    True
    >>> math_equal("2\\\\sqrt{3}", "\\\\sqrt{12}").equal
    True
    >>> math_equal("3", "4").equal
    False
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown isolation {isolation!r}; known: {', '.join(ISOLATIONS)}")
    timeout_s = max(1, int(timeout_s))
    on_main = threading.current_thread() is threading.main_thread()
    if isolation == "inline" or (isolation == "auto" and on_main):
        if not on_main:
            return MathVerdict(False, "isolation='inline' needs the main thread (math-verify uses signal.alarm)")
        return compare_inline(pred, gold, timeout_s, float_rounding, options)
    # gold parse + pred parse + comparison each get timeout_s inside the worker; allow start-up on top
    return _WORKER.compare(pred, gold, timeout_s, float_rounding, deadline_s=3 * timeout_s + 10, options=options)


def _serve() -> None:
    """Worker loop: one JSON request per stdin line, one JSON verdict per stdout line."""
    for line in sys.stdin:
        try:
            req = json.loads(line)
            opts = MathOptions(**req["options"]) if req.get("options") else None
            v = compare_inline(str(req["pred"]), str(req["gold"]), int(req["timeout_s"]), int(req["float_rounding"]),
                               opts)
        except Exception as e:  # noqa: BLE001
            v = MathVerdict(False, f"bad request: {e}")
        sys.stdout.write(json.dumps(v.__dict__) + "\n")
        sys.stdout.flush()

