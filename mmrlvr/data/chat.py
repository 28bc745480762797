"""Read a prompt stored as a chat (verl's ``prompt``, LLaVA / VLM-R1 ``conversations``) into our parts.

Frameworks store prompts as message lists in two shapes:

- OpenAI / transformers: ``[{"role": "system"|"user"|"assistant", "content": str | [part, ...]}]`` (verl,
  TRL, ms-swift). A content part is ``{"type": "text", "text": ...}``, ``{"type": "image"}`` (a placeholder
  for the row's next image), ``{"type": "image", "image": VALUE}`` (the image itself: a path, bytes, a data
  URL, PIL), ``{"type": "image_url", "image_url": {"url": ...}}`` (OpenAI), or the same for ``video``.
- LLaVA: ``[{"from": "human"|"gpt"|"system", "value": str}]`` (LLaVA, VLM-R1, ShareGPT).

``parse_chat`` returns the system text, the user text with one ``<image>`` / ``<video>`` placeholder per
visual part (in order, so the loader can check the count against the row's images), the last assistant
turn (LLaVA keeps the reference answer there), and any image / video values carried inline by the parts.
Strings are also normalised: Qwen's own ``<|vision_start|><|image_pad|><|vision_end|>`` markers become
``<image>`` (a prompt rendered once already would otherwise double its image tokens).

Only single-turn prompts are accepted: RL samples a reply to the user's turn, so a dataset whose prompt
holds several user turns is an error naming the row rather than a silent join.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mmrlvr.errors import DataError

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"

_ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
                 "model": "assistant", "system": "system"}
# Qwen chat-template markers that sometimes survive in exported prompts
_QWEN_IMAGE = re.compile(r"(?:<\|vision_start\|>)?(?:<\|image_pad\|>)+(?:<\|vision_end\|>)?")
_QWEN_VIDEO = re.compile(r"(?:<\|vision_start\|>)?(?:<\|video_pad\|>)+(?:<\|vision_end\|>)?")


def normalise_placeholders(text: str) -> str:
    """Qwen's rendered image/video markers -> ``<image>`` / ``<video>``.

    >>> normalise_placeholders("<|vision_start|><|image_pad|><|vision_end|>How many?")
    '<image>How many?'
    """
    if "<|" not in text:
        return text
    return _QWEN_VIDEO.sub(VIDEO_PLACEHOLDER, _QWEN_IMAGE.sub(IMAGE_PLACEHOLDER, text))


@dataclass
class ParsedChat:
    system: str | None = None
    user: str = ""
    assistant: str | None = None
    images: list[Any] = field(default_factory=list)  # values carried inline by content parts
    videos: list[Any] = field(default_factory=list)


def is_chat(value: Any) -> bool:
    """A non-empty list of message dicts (either shape), or a JSON string holding one."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]") and ("role" in text or "from" in text)):
            return False
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return False
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and all(isinstance(m, dict) and (("role" in m and "content" in m) or ("from" in m and "value" in m))
                    for m in value))


def _part_value(part: dict[str, Any], kind: str) -> Any:
    """The image/video a content part carries itself, or None for a bare placeholder part."""
    for key in (kind, f"{kind}_url", "url", "path"):
        v = part.get(key)
        if isinstance(v, dict):
            v = v.get("url") or v.get("path") or (v if v.get("bytes") else None)
        if v not in (None, ""):
            return v
    return None


def _content_text(content: Any, out: ParsedChat, where: str) -> str:
    """Text of one message's content with placeholders for visual parts; inline values go to ``out``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return normalise_placeholders(content)
    if not isinstance(content, (list, tuple)):
        raise DataError(f"{where}: content must be a string or a list of parts, got {type(content).__name__}")
    pieces: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            pieces.append(normalise_placeholders(part))
            continue
        if not isinstance(part, dict):
            raise DataError(f"{where}: content part {j} must be an object, got {type(part).__name__}")
        kind = part.get("type") or next((k for k in ("text", "image", "image_url", "video") if k in part), None)
        if kind == "text":
            pieces.append(normalise_placeholders(str(part.get("text") or "")))
        elif kind in ("image", "image_url"):
            value = _part_value(part, "image")
            if value is not None:
                out.images.append(value)
            pieces.append(IMAGE_PLACEHOLDER)
        elif kind in ("video", "video_url"):
            value = _part_value(part, "video")
            if value is not None:
                out.videos.append(value)
            pieces.append(VIDEO_PLACEHOLDER)
        else:
            raise DataError(f"{where}: content part {j} has unknown type {kind!r} (text, image, image_url, video)")
    return "".join(pieces)


def parse_chat(messages: Any) -> ParsedChat:
    """Split a chat (see the module docstring) into system / user / assistant text and inline visuals.

    >>> c = parse_chat([{"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "a cat"}])
    >>> (c.user, c.assistant)
    ('<image>What is it?', 'a cat')
    >>> parse_chat([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count."}]}]).user
    '<image>Count.'
    """
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            raise DataError(f"chat prompt is not valid JSON ({exc.msg})") from None
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError("chat prompt must be a non-empty list of messages")
    out = ParsedChat()
    users: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise DataError(f"message {i} must be an object, got {type(msg).__name__}")
        raw_role = msg.get("role", msg.get("from"))
        role = _ROLE_ALIASES.get(str(raw_role).lower()) if raw_role is not None else None
        if role is None:
            raise DataError(f"message {i} has unknown role {raw_role!r} (user/assistant/system or human/gpt)")
        text = _content_text(msg.get("content", msg.get("value")), out, f"message {i}")
        if role == "system":
            out.system = text.strip() or None
        elif role == "user":
            if out.assistant is not None and users:
                raise DataError(f"message {i}: multi-turn conversations are not supported (a user turn after "
                                "an assistant turn); keep one user turn per row")
            users.append(text)
        else:
            out.assistant = text.strip()
    if not users:
        raise DataError("chat prompt has no user message")
    if len(users) > 1:
        raise DataError(f"chat prompt has {len(users)} user messages; keep one user turn per row")
    out.user = users[0]
    return out
