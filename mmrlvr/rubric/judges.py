"""Model judges for rubric criteria: a local transformers model or any OpenAI-compatible endpoint.

Both share ``Judge.judge_batch``: every request is asked ``votes`` times (vote i uses seed i and, when
k > 1, ``vote_temperature``), each output is parsed strictly (``verdicts.parse_verdict``), the majority of
known votes decides, and a tie or no usable vote is unknown - never a pass. Raw outputs are cached on disk
(``cache.VerdictCache``) under (prompt version, judge identity, criterion, response section, question,
reference, image hashes, vote). Counters (``stats``) feed ``judge/unknown_rate`` and friends.

* ``openai``: the ``openai`` client against ``base_url`` (vLLM, SGLang, any compatible server), a per-call
  timeout, retries with exponential backoff + jitter on timeouts, connection errors, 429 and 5xx (other
  4xx are not retried), requests run concurrently on a thread pool (``concurrency``).
* ``local``: a transformers model from a local folder (``AutoModelForImageTextToText``, falling back to
  ``AutoModelForCausalLM`` for text-only judges), prompted through its chat template, generating in
  batches of ``batch_size``.

Prompts and fencing live in ``prompts``; what a judge may see is decided in ``routing``.
"""

from __future__ import annotations

import os
import random
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
                met, why, status = parse_verdict(out.text)
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
@JUDGES.register("openai")
class OpenAIJudge(Judge):
    """Any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp server, OpenAI).

    base_url: e.g. "http://127.0.0.1:8000/v1"; model: the served model name; api_key: defaults to the
    OPENAI_API_KEY environment variable, or "EMPTY" for local servers (never part of the identity).
    timeout: seconds per call; max_retries / backoff / backoff_max: retry schedule
    (sleep ≈ backoff·2^attempt, capped, with ±25% jitter); concurrency: calls in flight at once.
    extra_body: passed through to the server (e.g. vLLM's {"top_k": 1}).
    """

    name = "openai"
    RETRYABLE_STATUS = (408, 409, 429)

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 1.0, backoff_max: float = 30.0,
                 concurrency: int = 8, max_tokens: int = 256, extra_body: dict[str, Any] | None = None,
                 **common: Any) -> None:
        super().__init__(**common)
        import openai  # imported here so `import mmrlvr.rubric` stays light

        self._openai = openai
        self.model, self.base_url = model, base_url
        self.timeout, self.max_retries = float(timeout), int(max_retries)
        self.backoff, self.backoff_max = float(backoff), float(backoff_max)
        self.max_tokens, self.extra_body = int(max_tokens), dict(extra_body or {})
        self.concurrency = max(1, int(concurrency))
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        # retries are ours (counted, with our backoff); the client's own are off
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=self.timeout, max_retries=0)
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="judge")

    @property
    def identity(self) -> str:
        return f"openai:{self.base_url or 'api.openai.com'}:{self.model}:{PROMPT_VERSION}:" \
               f"t{self._temperature_for_votes():g}:m{self.max_tokens}"

    def messages(self, req: JudgeRequest) -> list[dict[str, Any]]:
        return openai_messages(req, max_chars=self.max_response_chars)

    def _generate(self, requests: list[JudgeRequest], votes: list[int]) -> list[Outcome]:
        return list(self._pool.map(self._call, requests, votes))

    def _call(self, req: JudgeRequest, vote: int) -> Outcome:
        oa = self._openai
        messages = self.messages(req)
        last = Outcome(None, ERROR, "no attempt made")
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._count(retries=1)
                delay = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
                time.sleep(delay * random.uniform(0.75, 1.25))
            try:
                resp = self.client.chat.completions.create(
                    model=self.model, messages=messages, temperature=self._temperature_for_votes(),
                    max_tokens=self.max_tokens, seed=vote, extra_body=self.extra_body or None)
                text = resp.choices[0].message.content
                if not isinstance(text, str):
                    return Outcome(None, ERROR, "the server returned no message text")
                return Outcome(text)
            except oa.APITimeoutError:
                last = Outcome(None, TIMEOUT, f"timed out after {self.timeout:g}s")
            except oa.APIConnectionError as exc:
                last = Outcome(None, ERROR, f"connection error: {exc}")
            except oa.APIStatusError as exc:
                last = Outcome(None, ERROR, f"HTTP {exc.status_code}: {str(exc)[:200]}")
                if exc.status_code < 500 and exc.status_code not in self.RETRYABLE_STATUS:
                    return last
            except Exception as exc:  # noqa: BLE001 - a garbage body must not crash the reward run
                return Outcome(None, ERROR, f"bad response from the server: {type(exc).__name__}: {str(exc)[:200]}")
        return last

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        super().close()


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


def build_judge(name: str, **params: Any) -> Judge:
    """Instantiate a registered judge by name (unknown names list the known ones)."""
    return JUDGES.get(name)(**params)
