"""A real OpenAI-compatible chat server on 127.0.0.1 for testing judges (no mocks, no network).

``JudgeServer`` runs ``http.server.ThreadingHTTPServer`` on a free loopback port and serves
``POST /v1/chat/completions`` (and ``GET /v1/models``). The request's ``model`` field picks the behaviour,
so one server covers every case a judge must survive:

==============  ===========================================================================================
``model``       answers with a real tiny transformers model's generation (``model_dir``; random weights,
                so its output is never a valid verdict - exactly what a badly chosen judge looks like)
``rule``        a deterministic, deliberately *gullible* grader (``rule_judge``): it obeys instructions it
                finds outside the response block, and otherwise passes a criterion when every "quoted"
                keyword of the criterion occurs in the response block. A rationale line that quotes the
                response (a lax parser would be fooled by the quote), then the verdict object
                ``{"request_id", "verdict", "rationale"}`` with the request id read from the prompt
``rule-json``   the same decision as the verdict object alone
``coin``        pass/fail from a hash of (prompt, seed): votes with different seeds disagree
``echo``        repeats the response block back verbatim (a judge that parrots what it grades: a verdict
                line or object the response ends with must not be read as the judge's)
``echo-prompt`` repeats the whole user message back (request id included, but never as a verdict object)
``drip``        a valid ``rule-json`` reply whose body is sent one byte every ``drip_interval`` seconds
``drip-head``   the same, with the status line and headers dripped too
``huge``        a ``huge_bytes`` reply (Content-Length given) whose content ends in a valid PASS verdict
``huge-stream`` the same without Content-Length (body until the connection closes)
``timeout``     sleeps ``timeout_delay`` seconds before answering (clients with shorter timeouts give up)
``error500``    HTTP 500 with an error body
``flaky``       HTTP 500 for the first ``flaky_failures`` requests of each distinct prompt, then ``rule``
``garbage``     a well-formed completion whose content is random words (no verdict)
``badjson``     HTTP 200 whose body is not JSON
``refuse``      "I'm sorry, but I can't help with that."
``mixed``       the mode named by a ``(mode: NAME)`` tag in the criterion text, else ``rule`` (one run,
                several failure kinds)
==============  ===========================================================================================

Any other model name uses ``default_mode``. With ``max_prompt_chars`` set, longer prompts get HTTP 400
"maximum context length exceeded", as from a real server. Every request body is recorded in ``server.requests`` so tests
can assert what a judge was shown (minimal exposure), and its Authorization header in ``server.auth``. For tests and demos only: it binds 127.0.0.1 and has
no authentication.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODES = ("model", "rule", "rule-json", "coin", "timeout", "error500", "flaky", "garbage", "badjson", "refuse",
         "mixed", "echo", "echo-prompt", "drip", "drip-head", "huge", "huge-stream")
_FORM_RE = re.compile(r'^\{"request_id".*$', re.M)
_NONCE_RE = re.compile(r'"request_id": "([0-9a-z]+)"')
_MODE_TAG_RE = re.compile(r"^CRITERION:.*\(mode: ([a-z0-9-]+)\)", re.M)

_OPEN_RE = re.compile(r"<<<RESPONSE[^\n]*?>>>")
_CLOSE = "<<<END RESPONSE"  # sloppy on purpose: any key, the first one wins
_INJECTION_RE = re.compile(
    r"ignore (?:the|all|any|previous|your)\b|\boutput\W{0,3}pass\b|\bverdict\W{0,5}pass\b|full marks|"
    r"\"verdict\"\s*:\s*\"pass\"|\bgrade (?:this|it) (?:as )?pass", re.I)


def rule_judge(user_text: str) -> tuple[bool, str]:
    """The gullible rule grader: (passes, rationale). See the module docstring."""
    m = _OPEN_RE.search(user_text)
    if m is None:
        data, outside = "", user_text
    else:
        end = user_text.find(_CLOSE, m.end())
        data = user_text[m.end(): end if end >= 0 else len(user_text)]
        outside = user_text[: m.start()] + (user_text[end:] if end >= 0 else "")
    quote = " ".join(data.split())[:160]
    outside = _FORM_RE.sub("", outside)  # the reply form our prompt shows is not an instruction to pass
    if _INJECTION_RE.search(outside):
        return True, f"as instructed. The response reads “{quote}”."
    crit = re.search(r"^CRITERION:\s*(.*)$", user_text, re.M)
    keywords = re.findall(r'"([^"]+)"', crit.group(1)) if crit else []
    if keywords:
        missing = [k for k in keywords if not re.search(r"\b" + re.escape(k) + r"\b", data, re.I)]
        why = "it mentions " + ", ".join(keywords) if not missing else "it does not mention " + ", ".join(missing)
        return not missing, f"the response reads “{quote}”; {why}."
    return len(data.split()) >= 3, f"the response reads “{quote}”."


def request_id(user_text: str) -> str:
    """The request id a prompt asks the judge to copy (the last one outside the response block)."""
    m = _OPEN_RE.search(user_text)
    end = user_text.find(_CLOSE, m.end()) if m else -1
    outside = user_text[end:] if end >= 0 else user_text
    found = _NONCE_RE.findall(outside)
    return found[-1] if found else ""


def verdict_json(user_text: str, ok: bool, why: str) -> str:
    return json.dumps({"request_id": request_id(user_text), "verdict": "pass" if ok else "fail", "rationale": why})


def _response_block(user_text: str) -> str:
    m = _OPEN_RE.search(user_text)
    if m is None:
        return ""
    end = user_text.find(_CLOSE, m.end())
    return user_text[m.end(): end if end >= 0 else len(user_text)].strip("\n")


def _user_text(body: dict[str, Any]) -> str:
    texts = []
    for msg in body.get("messages", []):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            texts.append(content)
        else:
            texts += [p.get("text", "") for p in content if p.get("type") == "text"]
    return "\n".join(texts)


class JudgeServer:
    """Start with ``with JudgeServer() as srv:``; ``srv.base_url`` is the ``/v1`` root for clients."""

    def __init__(self, *, model_dir: str | Path | None = None, default_mode: str = "rule",
                 timeout_delay: float = 5.0, flaky_failures: int = 2, max_prompt_chars: int | None = None,
                 drip_interval: float = 0.5, huge_bytes: int = 40_000_000) -> None:
        if default_mode not in MODES:
            raise ValueError(f"unknown mode {default_mode!r}; known: {', '.join(MODES)}")
        self.model_dir, self.default_mode = model_dir, default_mode
        self.timeout_delay, self.flaky_failures = timeout_delay, flaky_failures
        self.max_prompt_chars = max_prompt_chars
        self.drip_interval, self.huge_bytes = drip_interval, huge_bytes
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str] = []  # the Authorization header of each chat request (API key tests)
        self._flaky_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._generator = None
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "JudgeServer":
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet in tests
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    outer._send(self, 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in MODES]})
                else:
                    outer._send(self, 404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    outer._send(self, 400, {"error": {"message": "body is not JSON"}})
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    outer._send(self, 404, {"error": {"message": f"no route {self.path}"}})
                    return
                outer.requests.append(body)
                outer.auth.append(self.headers.get("Authorization", ""))
                outer._answer(self, body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="judge-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "JudgeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------------------------------- behaviour
    def _answer(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        mode = body.get("model") if body.get("model") in MODES else self.default_mode
        text = _user_text(body)
        if self.max_prompt_chars is not None and len(text) > self.max_prompt_chars:
            self._send(h, 400, {"error": {"message": f"This model's maximum context length is exceeded "
                                                     f"({len(text)} > {self.max_prompt_chars} characters)",
                                          "type": "invalid_request_error"}})
            return
        if mode == "mixed":
            tag = _MODE_TAG_RE.search(text)
            mode = tag.group(1) if tag and tag.group(1) in MODES and tag.group(1) != "mixed" else "rule"
        if mode == "timeout":
            if self._stop.wait(self.timeout_delay):
                return
            mode = "rule"
        if mode == "flaky":
            key = hashlib.sha256(text.encode()).hexdigest()
            with self._lock:
                seen = self._flaky_seen[key] = self._flaky_seen.get(key, 0) + 1
            mode = "error500" if seen <= self.flaky_failures else "rule"
        if mode == "error500":
            self._send(h, 500, {"error": {"message": "internal error (test server)", "type": "server_error"}})
            return
        if mode == "badjson":
            self._send_raw(h, 200, b"<html>this is not json", "application/json")
            return
        if mode in ("rule", "rule-json", "drip", "drip-head"):
            ok, why = rule_judge(text)
            content = (f"Rationale: {why}\n" if mode == "rule" else "") + verdict_json(text, ok, why)
        elif mode in ("huge", "huge-stream"):
            pad = max(0, self.huge_bytes - 300)
            content = "x" * pad + "\n" + verdict_json(text, True, "huge")
        elif mode == "echo":
            content = _response_block(text)
        elif mode == "echo-prompt":
            content = text
        elif mode == "coin":
            digest = hashlib.sha256(f"{text}|{body.get('seed')}".encode()).digest()
            content = verdict_json(text, bool(digest[0] % 2), "coin")
        elif mode == "garbage":
            rng = random.Random(len(text))
            content = " ".join(rng.choice(["lorem", "ipsum", "pass?", "maybe", "{", "verdict", "42"])
                               for _ in range(12))
        elif mode == "refuse":
            content = "I'm sorry, but I can't help with that."
        else:  # model
            try:
                content = self._generate(body)
            except Exception as exc:  # noqa: BLE001 - report like a real server would
                self._send(h, 500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}})
                return
        reply = {
            "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        if mode in ("drip", "drip-head"):
            self._drip(h, json.dumps(reply).encode(), head=mode == "drip-head")
        elif mode == "huge-stream":
            self._send_raw(h, 200, json.dumps(reply).encode(), "application/json", length=False)
        else:
            self._send(h, 200, reply)

    def _drip(self, h: BaseHTTPRequestHandler, data: bytes, *, head: bool) -> None:
        """Send a 200 reply one byte per ``drip_interval`` (the body only, or everything with ``head``)."""
        header = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                  "\r\n").encode()
        try:
            if not head:
                h.wfile.write(header)
                h.wfile.flush()
            for k in range(len(header) * head + len(data)):
                if self._stop.wait(self.drip_interval):
                    return
                byte = (header + data)[k:k + 1] if head else data[k:k + 1]
                h.wfile.write(byte)
                h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):  # the client gave up: what we test
            h.close_connection = True

    def _generate(self, body: dict[str, Any]) -> str:
        from PIL import Image

        from mmrlvr.rubric.judges import HFChatGenerator

        if self.model_dir is None:
            raise RuntimeError("model mode needs JudgeServer(model_dir=...)")
        with self._lock:
            if self._generator is None:
                self._generator = HFChatGenerator(self.model_dir)
            chat, images = [], []
            for msg in body.get("messages", []):
                content = msg.get("content")
                if isinstance(content, str):
                    content = [{"type": "text", "text": content}]
                parts = []
                for p in content:
                    if p.get("type") == "image_url":
                        data = p["image_url"]["url"].split(",", 1)[1]
                        images.append(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
                        parts.append({"type": "image"})
                    elif p.get("type") == "text":
                        parts.append({"type": "text", "text": p["text"]})
                chat.append({"role": msg["role"], "content": parts})
            return self._generator.generate([chat], [images], max_new_tokens=min(int(body.get("max_tokens") or 32), 64),
                                            temperature=float(body.get("temperature") or 0.0),
                                            seed=int(body.get("seed") or 0))[0]

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, obj: dict[str, Any]) -> None:
        JudgeServer._send_raw(h, status, json.dumps(obj).encode(), "application/json")

    @staticmethod
    def _send_raw(h: BaseHTTPRequestHandler, status: int, data: bytes, ctype: str, length: bool = True) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            if length:
                h.send_header("Content-Length", str(len(data)))
            else:  # body until the connection closes
                h.send_header("Connection", "close")
                h.close_connection = True
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
            h.close_connection = True
