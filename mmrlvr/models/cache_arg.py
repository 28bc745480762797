"""The KV-cache keyword of a model's ``forward``, ``generate`` and ``compute_3d_position_ids`` across transformers
releases: ``past_key_values`` up to 5.19 (what vLLM 0.32 pins), ``cache`` later.

A wrong name is not an error: ``forward`` takes ``**kwargs`` and drops it, so the model silently runs without its
cache — a suffix pass then attends to nothing before it. Every call that hands a cache over takes its keyword from
here.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable


@functools.lru_cache(maxsize=None)
def _keyword_of(fn: Callable[..., Any]) -> str:
    params = inspect.signature(fn).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise TypeError(f"{getattr(fn, '__qualname__', fn)} takes neither 'cache' nor 'past_key_values'")


def _unwrapped(model: Any) -> Any:
    """The transformers model under a peft wrapper (whose own forward takes ``*args, **kwargs``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base


def cache_keyword(model: Any) -> str:
    """``"cache"`` or ``"past_key_values"``: what ``model.forward`` (and so ``generate``) names its KV cache."""
    return _keyword_of(type(_unwrapped(model)).forward)


def with_cache(model: Any, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``model(**...)`` / ``model.generate(**...)``."""
    return {cache_keyword(model): cache}


def positions_cache_kwargs(backbone: Any) -> dict[str, Any]:
    """The empty-cache keyword of ``backbone.compute_3d_position_ids`` (``{"cache": None}`` or
    ``{"past_key_values": None}``): the name its ``forward`` uses (transformers renamed both in one release; the
    forward's signature is the one a wrapper around the positions method leaves intact)."""
    return {cache_keyword(backbone): None}


def output_cache(out: Any) -> Any:
    """The KV cache a forward or ``generate`` returned, under either release's name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def continues_with_new_images(model: Any) -> bool:
    """Whether ``generate`` with a cache places the 3D positions of images that arrive after the cached prefix (a
    multi-turn rollout's tool turn) as a whole-sequence pass does. Measured: yes on the releases that name the
    cache ``cache`` (5.2x: the HF multi-turn rollouts equal teacher forcing to 1e-5); no on 5.19, where the
    continuation's log-probs were 0.003 to 0.06 off, so there a turn that brings images runs the whole history again
    (what that release did anyway while the cache went under a name it drops)."""
    return cache_keyword(model) == "cache"
