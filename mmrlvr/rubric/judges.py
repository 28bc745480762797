"""Model judges for rubric criteria: a local transformers model or any OpenAI-compatible endpoint.

Both share ``Judge.judge_batch``: every request is asked ``votes`` times (vote i uses seed i and, when
k > 1, ``vote_temperature``), each output is parsed strictly against the request's id
(``verdicts.parse_verdict``), the majority of known votes decides, and a tie or no usable vote is unknown -
never a pass. Raw outputs are cached on disk (``cache.VerdictCache``) under (prompt version, judge identity,
criterion, response section, question, reference, image hashes, vote). Counters (``stats``) feed
``judge/unknown_rate`` and friends.

* ``openai``: the ``openai`` client against ``base_url`` (vLLM, SGLang, any compatible server). Retries are
  the client's own (``max_retries``: exponential backoff with jitter on timeouts, connection errors, 408,
  409, 429 and 5xx; other 4xx are not retried). ``timeout`` is a TOTAL deadline per attempt - connect,
  first byte and the whole body - enforced under httpx by a network backend that gives every socket
  operation only the time left (a server that drips its reply one byte at a time cannot hold a call past
  it), and a reply over ``max_response_bytes`` is cut off unparsed. Requests run concurrently on a thread
  pool (``concurrency``). The API key comes from ``api_key_env`` (an environment variable's name) or
  ``api_key_file`` (a file holding only the key), so config files and run folders never hold it; without
  either, ``OPENAI_API_KEY`` or "EMPTY" (local servers).
* ``local``: a transformers model from a local folder (``AutoModelForImageTextToText``, falling back to
  ``AutoModelForCausalLM`` for text-only judges), prompted through its chat template, generating in
  batches of ``batch_size``.

Prompts and fencing live in ``prompts``; what a judge may see is decided in ``routing``.
"""

from __future__ import annotations

import inspect
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from PIL import Image

from mmrlvr.errors import UserError
from mmrlvr.registry import Registry
from mmrlvr.rubric.cache import VerdictCache, cache_key
from mmrlvr.rubric.prompts import PROMPT_VERSION, JudgeRequest, hf_messages, openai_messages
from mmrlvr.rubric.verdicts import ERROR, OK, TIMEOUT, Verdict, majority, parse_verdict

class JudgeUnavailableError(UserError):
    """The judge is effectively down (unknown rate over ``max_unknown_rate``): stop, naming the endpoint."""


#: name -> factory(**params) -> Judge
JUDGES: Registry[Callable[..., "Judge"]] = Registry("judge")


@dataclass
class JudgeStats:
    """Counters since the judge was built (or since ``reset``)."""

    requests: int = 0       # criterion x response pairs asked
    calls: int = 0          # model calls made (votes x uncached requests, retries not counted)
    cache_hits: int = 0
    retries: int = 0
    timeouts: int = 0       # calls that ended in a timeout after all retries
    errors: int = 0         # calls that ended in an HTTP / model error after all retries
    unparseable: int = 0    # outputs with no strict verdict (incl. contradictions)
    refusals: int = 0
    unknown: int = 0        # final verdicts that were unknown

    def as_metrics(self, prefix: str = "judge/") -> dict[str, float]:
        out = {prefix + k: float(v) for k, v in asdict(self).items()}
        out[prefix + "unknown_rate"] = self.unknown / self.requests if self.requests else 0.0
        return out


@dataclass
class Outcome:
    """One model call: ``text`` when an answer arrived, else ``status`` timeout/error with ``detail``."""

    text: str | None
    status: str = OK
    detail: str = ""


class Judge(ABC):
    """Shared voting, caching, parsing and counting; backends implement ``_generate``."""

    name = "judge"

    def __init__(self, *, votes: int = 1, temperature: float = 0.0, vote_temperature: float = 0.7,
                 max_response_chars: int = 8000, cache: str | Path | VerdictCache | None = None) -> None:
        if votes < 1:
            raise UserError(f"judge votes must be >= 1, got {votes}")
        self.votes, self.temperature, self.vote_temperature = votes, temperature, vote_temperature
        self.max_response_chars = max_response_chars
        self.cache = VerdictCache(cache) if isinstance(cache, (str, Path)) else cache
        self.stats = JudgeStats()
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        """Where verdicts come from, for messages (a URL and model, or a model folder)."""
        return self.name

    # identity: everything that changes the judge's answers (not secrets, not the vote count)
    @property
    def identity(self) -> str:
        return f"{self.name}:{PROMPT_VERSION}:t{self._temperature_for_votes():g}"

    def _temperature_for_votes(self) -> float:
        return self.temperature if self.votes == 1 else self.vote_temperature

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)

    def key(self, req: JudgeRequest, vote: int) -> str:
        crit = req.criterion
        return cache_key(PROMPT_VERSION, self.identity, crit.text, crit.check.canonical(), req.response_part,
                         req.question, req.reference, req.image_hashes, vote)

    def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[Verdict]:
        """One verdict per request (majority over ``votes``); never raises for judge failures."""
        calls = [(i, v) for i in range(len(requests)) for v in range(self.votes)]
        outcomes: dict[tuple[int, int], Outcome] = {}
        todo = []
        for i, v in calls:
            raw = self.cache.get(self.key(requests[i], v)) if self.cache is not None else None
            if raw is not None:
                outcomes[(i, v)] = Outcome(raw)
            else:
                todo.append((i, v))
        self._count(requests=len(requests), cache_hits=len(calls) - len(todo), calls=len(todo))
        if todo:
            fresh = self._generate([requests[i] for i, _ in todo], [v for _, v in todo])
            for (i, v), out in zip(todo, fresh):
                outcomes[(i, v)] = out
                if out.status == OK and out.text is not None and self.cache is not None:
                    self.cache.put(self.key(requests[i], v), out.text, self.identity)
        verdicts = []
        for i in range(len(requests)):
            votes, raws = [], []
            for v in range(self.votes):
                out = outcomes[(i, v)]
                if out.status != OK or out.text is None:
                    self._count(timeouts=out.status == TIMEOUT, errors=out.status != TIMEOUT)
                    votes.append((None, out.detail or out.status, out.status))
                    continue
                met, why, status = parse_verdict(out.text, requests[i].nonce)
                self._count(unparseable=status not in (OK, "refusal"), refusals=status == "refusal")
                votes.append((met, why, status))
                raws.append(out.text)
            met, why, status = majority(votes)
            self._count(unknown=met is None)
            verdicts.append(Verdict(met, why, status, self.identity, tuple(m for m, _, _ in votes),
                                    raws[0] if raws else ""))
        return verdicts

    @abstractmethod
    def _generate(self, requests: list[JudgeRequest], votes: list[int]) -> list[Outcome]:
        """One ``Outcome`` per (request, vote index); failures are returned as outcomes, never raised."""

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


# --------------------------------------------------------------------------------------------- openai
class _CallState(threading.local):
    """Per-thread state of the HTTP attempt in progress (each judge worker thread runs one call at a time)."""

    deadline: float = math.inf   # time.monotonic() by which the whole attempt must be done
    max_bytes: int = 0           # reply size cap (status line + headers + body)
    read_bytes: int = 0
    attempts: int = 0            # HTTP attempts of the current call (retries = attempts - 1)
    reason: str = ""             # "deadline" | "size" when our limits cut the attempt

    def begin_call(self) -> None:
        self.attempts, self.reason = 0, ""

    def begin_attempt(self, timeout: float, max_bytes: int) -> None:
        self.deadline, self.max_bytes, self.read_bytes = time.monotonic() + timeout, max_bytes, 0
        self.attempts += 1

    def left(self, timeout: float | None, exc: type[Exception]) -> float:
        """The socket timeout for the next operation: what is left of the deadline (raises when nothing)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.reason = "deadline"
            raise exc("the judge call's total deadline passed")
        return left if timeout is None else min(timeout, left)


def _http_modules() -> tuple[Any, Any]:
    """(httpx-like, httpcore-like) modules of the HTTP stack the installed openai client is built on
    (openai >= 3 uses the httpx2 / httpcore2 fork, older releases httpx / httpcore)."""
    import importlib

    import openai

    top = openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0]
    core = {"httpx": "httpcore", "httpx2": "httpcore2"}.get(top)
    if core is None:
        raise RuntimeError(f"unsupported HTTP client under openai: {top}")
    return importlib.import_module(top), importlib.import_module(core)


_TRANSPORT: Any = None


def deadline_transport(state: _CallState, timeout: float, max_bytes: int) -> Any:
    """A ``DeadlineTransport`` for the openai client's HTTP stack (built once per process)."""
    global _TRANSPORT
    if _TRANSPORT is None:
        _TRANSPORT = _make_transport_class(*_http_modules())
    return _TRANSPORT(state, timeout, max_bytes)


def _make_transport_class(hx: Any, hc: Any) -> Any:
    """Define the deadline-enforcing stream, backend and transport on the given httpx / httpcore pair."""
    stream_class = _deadline_stream_class(hc)
    backend_class = _deadline_backend_class(hc, stream_class)
    return _deadline_transport_class(hx, backend_class)


def _deadline_stream_class(hc: Any) -> Any:
    """``_DeadlineStream`` on httpcore-like ``hc``: the socket stream the deadline backend hands out."""

    class _DeadlineStream(hc.NetworkStream):
        """A socket stream whose every read/write gets only the time left, and whose reads count bytes."""

        def __init__(self, stream: hc.NetworkStream, state: _CallState) -> None:
            self._stream, self._state = stream, state

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            data = self._stream.read(max_bytes, self._state.left(timeout, hc.ReadTimeout))
            self._state.read_bytes += len(data)
            if self._state.max_bytes and self._state.read_bytes > self._state.max_bytes:
                self._state.reason = "size"
                raise hc.ReadError(f"the judge's reply exceeds {self._state.max_bytes} bytes")
            return data

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._stream.write(buffer, self._state.left(timeout, hc.WriteTimeout))

        def close(self) -> None:
            self._stream.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> hc.NetworkStream:
            inner = self._stream.start_tls(ssl_context, server_hostname,
                                           self._state.left(timeout, hc.ConnectTimeout))
            return _DeadlineStream(inner, self._state)

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    return _DeadlineStream


def _deadline_backend_class(hc: Any, stream_class: Any) -> Any:
    """``_DeadlineBackend`` on httpcore-like ``hc``, wrapping every stream it opens in ``stream_class``."""

    class _DeadlineBackend(hc.NetworkBackend):
        """httpcore's sync backend with connects bounded by the deadline and streams wrapped."""

        def __init__(self, backend: hc.NetworkBackend, state: _CallState) -> None:
            self._backend, self._state = backend, state

        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> hc.NetworkStream:
            stream = self._backend.connect_tcp(host, port, self._state.left(timeout, hc.ConnectTimeout),
                                               local_address, socket_options)
            return stream_class(stream, self._state)

        def connect_unix_socket(self, path: str, timeout: float | None = None,
                                socket_options: Any = None) -> hc.NetworkStream:
            stream = self._backend.connect_unix_socket(path, self._state.left(timeout, hc.ConnectTimeout),
                                                       socket_options)
            return stream_class(stream, self._state)

        def sleep(self, seconds: float) -> None:
            self._backend.sleep(seconds)

    return _DeadlineBackend


def _deadline_transport_class(hx: Any, backend_class: Any) -> Any:
    """``DeadlineTransport`` on httpx-like ``hx``, its connection pool's network backend wrapped in
    ``backend_class``."""

    class DeadlineTransport(hx.HTTPTransport):
        """httpx transport: a total deadline (connect + first byte + body) and a size cap per attempt.

        Each ``handle_request`` (one attempt; the openai client retries by calling it again) starts a fresh
        deadline of ``timeout`` seconds; the body is read later on the same thread, under the same deadline.
        A reply that was cut for its size is not asked for again, and a ``Retry-After`` longer than
        ``timeout`` is dropped (a server must not make the client sleep past the deadline between attempts).
        """

        def __init__(self, state: _CallState, timeout: float, max_bytes: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            pool = getattr(self, "_pool", None)
            if not hasattr(pool, "_network_backend"):  # guard against an httpx/httpcore layout change
                raise RuntimeError("mmrlvr's judge deadline needs hx.HTTPTransport._pool._network_backend")
            pool._network_backend = backend_class(pool._network_backend, state)
            self._state, self._timeout, self._max_bytes = state, timeout, max_bytes

        def handle_request(self, request: hx.Request) -> hx.Response:
            if self._state.reason == "size":
                raise hx.ReadError(f"the judge's reply exceeded {self._max_bytes} bytes; not asked again",
                                      request=request)
            self._state.begin_attempt(self._timeout, self._max_bytes)
            response = super().handle_request(request)
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > self._max_bytes:
                response.close()
                self._state.reason = "size"
                raise hx.ReadError(f"the judge's reply is {length} bytes, over {self._max_bytes}", request=request)
            _drop_long_retry_after(response.headers, self._timeout)
            return response

    return DeadlineTransport


def _drop_long_retry_after(headers: Any, timeout: float) -> None:
    """Remove ``Retry-After`` / ``Retry-After-Ms`` from a reply's ``headers`` when it asks for a wait longer
    than ``timeout`` (an HTTP date counts as longer: it is not honoured)."""
    for key in ("retry-after", "retry-after-ms"):
        value = headers.get(key, "")
        try:
            seconds = float(value) / (1000.0 if key.endswith("ms") else 1.0)
        except ValueError:
            seconds = math.inf if value else 0.0  # an HTTP date: not honoured
        if seconds > timeout:
            del headers[key]


def resolve_api_key(api_key: str | None = None, api_key_env: str | None = None,
                    api_key_file: str | Path | None = None) -> str:
    """The judge's API key from exactly one source: ``api_key_env`` (a variable's name), ``api_key_file``
    (a file holding only the key), ``api_key`` (literal; avoid in configs), else OPENAI_API_KEY or "EMPTY"."""
    given = [n for n, v in (("api_key", api_key), ("api_key_env", api_key_env), ("api_key_file", api_key_file))
             if v not in (None, "")]
    if len(given) > 1:
        raise UserError(f"judge: give the API key one way, not {' and '.join(given)}")
    if api_key_env:
        if not isinstance(api_key_env, str) or not api_key_env.replace("_", "").isalnum():
            raise UserError(f"judge api_key_env: expected the NAME of an environment variable, got {api_key_env!r}")
        value = os.environ.get(api_key_env, "")
        if not value:
            raise UserError(f"judge api_key_env: environment variable {api_key_env} is not set (or empty)")
        return value
    if api_key_file:
        path = Path(os.path.expanduser(str(api_key_file)))
        if not path.is_file():
            raise UserError(f"judge api_key_file: {path} not found")
        value = path.read_text(encoding="utf-8").strip()
        if not value or "\n" in value:
            raise UserError(f"judge api_key_file: {path} must hold the key alone on one line")
        return value
    if api_key:
        return str(api_key)
    return os.environ.get("OPENAI_API_KEY") or "EMPTY"


@JUDGES.register("openai")
class OpenAIJudge(Judge):
    """Any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp server, OpenAI).

    base_url: e.g. "http://127.0.0.1:8000/v1"; model: the served model name.
    api_key_env: name of the environment variable holding the key (preferred); api_key_file: a file
    holding only the key; api_key: the key itself (kept out of run folders only by redaction - avoid);
    none of them: OPENAI_API_KEY, else "EMPTY" for local servers. Never part of the identity.
    timeout: total seconds per attempt (connect + first byte + whole body); max_retries: the openai
    client's retries; max_response_bytes: replies larger than this are cut off unparsed (a verdict is a
    few hundred bytes); concurrency: calls in flight at once; extra_body: passed through to the server
    (e.g. vLLM's {"top_k": 1}); response_format: "none" or "json_schema" (the server constrains the
    reply to the verdict object, request id included, e.g. vLLM/SGLang guided decoding).
    """

    name = "openai"
    RESPONSE_FORMATS = ("none", "json_schema")

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 api_key_env: str | None = None, api_key_file: str | None = None,
                 timeout: float = 60.0, max_retries: int = 2, max_response_bytes: int = 1_000_000,
                 concurrency: int = 8, max_tokens: int = 256, extra_body: dict[str, Any] | None = None,
                 response_format: str = "none", **common: Any) -> None:
        super().__init__(**common)
        import openai  # imported here so `import mmrlvr.rubric` stays light

        if not isinstance(model, str) or not model:
            raise UserError(f"judge openai: model must be the served model's name, got {model!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise UserError(f"judge openai: timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise UserError(f"judge openai: max_retries must be an integer >= 0, got {max_retries!r}")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or max_response_bytes < 1024:
            raise UserError(f"judge openai: max_response_bytes must be an integer >= 1024, got {max_response_bytes!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise UserError(f"judge openai: concurrency must be an integer >= 1, got {concurrency!r}")
        if response_format not in self.RESPONSE_FORMATS:
            raise UserError(f"judge openai: response_format must be one of {', '.join(self.RESPONSE_FORMATS)}, "
                            f"got {response_format!r}")
        self._openai = openai
        self.model, self.base_url = model, base_url
        self.timeout, self.max_retries = float(timeout), int(max_retries)
        self.max_response_bytes = int(max_response_bytes)
        self.max_tokens, self.extra_body = int(max_tokens), dict(extra_body or {})
        self.response_format = response_format
        self.concurrency = concurrency
        self._state = _CallState()
        transport = deadline_transport(self._state, self.timeout, self.max_response_bytes)
        self.client = openai.OpenAI(
            base_url=base_url, api_key=resolve_api_key(api_key, api_key_env, api_key_file),
            timeout=self.timeout, max_retries=self.max_retries,
            http_client=openai.DefaultHttpxClient(transport=transport, timeout=self.timeout))
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="judge")

    @property
    def endpoint(self) -> str:
        return f"{self.base_url or 'https://api.openai.com/v1'} (model {self.model})"

    @property
    def identity(self) -> str:
        return f"openai:{self.base_url or 'api.openai.com'}:{self.model}:{PROMPT_VERSION}:" \
               f"t{self._temperature_for_votes():g}:m{self.max_tokens}"

    def messages(self, req: JudgeRequest) -> list[dict[str, Any]]:
        return openai_messages(req, max_chars=self.max_response_chars)

    def _generate(self, requests: list[JudgeRequest], votes: list[int]) -> list[Outcome]:
        return list(self._pool.map(self._call, requests, votes))

    def _call(self, req: JudgeRequest, vote: int) -> Outcome:
        oa, state = self._openai, self._state
        state.begin_call()
        extra: dict[str, Any] = {}
        if self.response_format == "json_schema":
            extra["response_format"] = {"type": "json_schema", "json_schema": verdict_schema(req.nonce)}
        try:
            resp = self.client.chat.completions.create(
                model=self.model, messages=self.messages(req), temperature=self._temperature_for_votes(),
                max_tokens=self.max_tokens, seed=vote, extra_body=self.extra_body or None, **extra)
            text = resp.choices[0].message.content
            out = Outcome(text) if isinstance(text, str) else \
                Outcome(None, ERROR, "the server returned no message text")
        except oa.APITimeoutError:
            out = Outcome(None, TIMEOUT, f"no complete reply within {self.timeout:g}s (connect + first byte + "
                                         f"body), {state.attempts} attempt(s)")
        except oa.APIConnectionError as exc:
            out = Outcome(None, ERROR, f"reply larger than {self.max_response_bytes} bytes, not parsed"
                          if state.reason == "size" else f"connection error: {exc}")
        except oa.APIStatusError as exc:
            out = Outcome(None, ERROR, f"HTTP {exc.status_code}: {str(exc)[:200]}")
        except Exception as exc:  # noqa: BLE001 - a garbage body must not crash the reward run
            out = Outcome(None, ERROR, f"bad response from the server: {type(exc).__name__}: {str(exc)[:200]}")
        self._count(retries=max(0, state.attempts - 1))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        super().close()


def verdict_schema(nonce: str) -> dict[str, Any]:
    """The JSON schema of the verdict object for one request (``response_format: json_schema``)."""
    return {"name": "verdict", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["request_id", "verdict", "rationale"],
        "properties": {"request_id": {"type": "string", "enum": [nonce]},
                       "verdict": {"type": "string", "enum": ["pass", "fail"]},
                       "rationale": {"type": "string", "maxLength": 300}}}}


# ---------------------------------------------------------------------------------------------- local
class HFChatGenerator:
    """Chat generation with a local transformers model (VLM or text-only LM); also used by the test server."""

    def __init__(self, model_path: str | Path, *, device: str = "cpu", dtype: str = "auto") -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        from mmrlvr.models.compat import load_processor

        path = Path(model_path)
        if not path.is_dir():
            raise UserError(f"local judge: model folder {path} not found")
        self.torch = torch
        config = AutoConfig.from_pretrained(str(path))
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        try:
            self.model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch_dtype)
            self.processor = load_processor(path, getattr(config, "model_type", None))
        except (ValueError, KeyError):
            self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
            self.processor = AutoTokenizer.from_pretrained(str(path))
        self.model.to(device).eval()
        self.device = device
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.is_vlm = hasattr(self.processor, "image_processor")

    def generate(self, chats: list[list[dict[str, Any]]], images: list[list[Image.Image]], *,
                 max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0) -> list[str]:
        """Generate one reply per chat; ``images[i]`` fill the ``{"type": "image"}`` parts of chat i."""
        torch = self.torch
        if not self.is_vlm:
            if any(images):
                raise UserError("this local judge is a text-only model; criteria with needs_image need a VLM")
            chats = [[{"role": m["role"], "content": _flatten_text(m["content"])} for m in c] for c in chats]
        texts = self.processor.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        flat = [im.convert("RGB") for ims in images for im in ims]
        if self.is_vlm:
            inputs = self.processor(text=texts, images=flat or None, return_tensors="pt", padding=True)
        else:
            inputs = self.processor(texts, return_tensors="pt", padding=True)
        inputs = inputs.to(self.device)
        torch.manual_seed(seed)
        sample = temperature > 0
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=sample,
                                      pad_token_id=self.tokenizer.pad_token_id)
        if sample:
            kwargs["temperature"] = temperature
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            out = self.model.generate(**inputs, **kwargs)
        new = out[:, inputs["input_ids"].shape[1]:]
        return self.tokenizer.batch_decode(new, skip_special_tokens=True)


def _flatten_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


@JUDGES.register("local")
class LocalJudge(Judge):
    """A transformers model in this process: ``model_path`` (a local folder), greedy unless voting.

    device: "cpu", "cuda", "cuda:1", ...; batch_size: prompts per ``generate`` call; max_new_tokens: the
    judge's output budget (a JSON verdict needs ~40 tokens).
    """

    name = "local"

    def __init__(self, model_path: str, *, device: str = "cpu", dtype: str = "auto", batch_size: int = 4,
                 max_new_tokens: int = 128, **common: Any) -> None:
        super().__init__(**common)
        self.model_path = str(model_path)
        self.batch_size, self.max_new_tokens = max(1, int(batch_size)), int(max_new_tokens)
        self.generator = HFChatGenerator(model_path, device=device, dtype=dtype)

    @property
    def endpoint(self) -> str:
        return f"local model {self.model_path}"

    @property
    def identity(self) -> str:
        return f"local:{Path(self.model_path).resolve()}:{PROMPT_VERSION}:t{self._temperature_for_votes():g}:" \
               f"m{self.max_new_tokens}"

    def _generate(self, requests: list[JudgeRequest], votes: list[int]) -> list[Outcome]:
        results: dict[int, Outcome] = {}
        # one seed per vote: batch requests of the same vote so each vote's sampling is reproducible
        for vote in sorted(set(votes)):
            idx = [k for k in range(len(requests)) if votes[k] == vote]
            for start in range(0, len(idx), self.batch_size):
                group = idx[start:start + self.batch_size]
                try:
                    texts = self.generator.generate(
                        [hf_messages(requests[k], max_chars=self.max_response_chars) for k in group],
                        [list(requests[k].images) for k in group], max_new_tokens=self.max_new_tokens,
                        temperature=self._temperature_for_votes(), seed=vote)
                    results.update({k: Outcome(t) for k, t in zip(group, texts)})
                except UserError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one failing batch is unknown, the run goes on
                    results.update({k: Outcome(None, ERROR, f"{type(exc).__name__}: {str(exc)[:200]}")
                                    for k in group})
        return [results[k] for k in range(len(requests))]


#: judge_params keys that hold secrets: redact them wherever a config is written or logged
SECRET_PARAMS = ("api_key",)


def judge_param_problems(name: str, params: dict[str, Any]) -> list[str]:
    """Every problem with a judge name and its parameters, without building it (no model, no network).

    Checked: the name is registered, every key is a parameter of that judge, the API key sources
    (one at most; an ``api_key_env`` variable that is set; an ``api_key_file`` that exists). Value ranges
    are checked when the judge is built (``build_judge`` raises ``UserError`` naming the parameter).
    """
    if name not in JUDGES:
        return [f"unknown judge {name!r}; known: {', '.join(JUDGES.names())}"]
    factory = JUDGES.get(name)
    known = judge_params_known(factory)
    out = [f"judge {name!r}: unknown parameter {k!r}; known: {', '.join(sorted(known))}"
           for k in params if k not in known]
    if "api_key_env" in known:
        try:
            resolve_api_key(params.get("api_key"), params.get("api_key_env"), params.get("api_key_file"))
        except UserError as exc:
            out.append(str(exc))
    return out


def judge_params_known(factory: Callable[..., Judge]) -> set[str]:
    names: set[str] = set()
    for fn in (factory.__init__, Judge.__init__):
        names |= {n for n, prm in inspect.signature(fn).parameters.items()
                  if n != "self" and prm.kind not in (prm.VAR_KEYWORD, prm.VAR_POSITIONAL)}
    return names


def judge_endpoint_problem(name: str, params: dict[str, Any], timeout: float = 5.0) -> str | None:
    """For ``--dry-run``: None when an ``openai`` judge's server answers ``GET {base_url}/models`` within
    ``timeout`` seconds (and serves ``model`` when it lists models), else one line saying what is wrong.
    Other judges (``local``: a folder, checked when built) give None. Never raises for network errors."""
    if name != "openai" or judge_param_problems(name, params):
        return None
    try:
        judge = build_judge(name, **{**params, "timeout": min(float(params.get("timeout", timeout)), timeout),
                                     "max_retries": 0})
    except UserError as exc:
        return str(exc)
    try:
        served = [m.id for m in judge.client.models.list()]
    except Exception as exc:  # noqa: BLE001 - report, do not crash a dry run
        return (f"judge openai: {judge.endpoint} did not answer GET /models within {timeout:g}s "
                f"({type(exc).__name__}: {str(exc)[:120]})")
    finally:
        judge.close()
    if served and judge.model not in served:
        return f"judge openai: {judge.endpoint}: the server does not serve model {judge.model!r}; it serves " \
               f"{', '.join(served[:10])}"
    return None


def build_judge(name: str, **params: Any) -> Judge:
    """Instantiate a registered judge by name; bad names and parameters are ``UserError``s listing the known."""
    problems = judge_param_problems(name, params)
    if problems:
        raise UserError("; ".join(problems))
    try:
        return JUDGES.get(name)(**params)
    except TypeError as exc:  # e.g. a required parameter missing
        raise UserError(f"judge {name!r}: {exc}") from None
