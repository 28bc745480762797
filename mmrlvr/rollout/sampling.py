"""Per-row seeded sampling: the same (seed, step, prompt id, sample index) gives the same response.

Why not ``generate(do_sample=True)``: it draws every row from one global generator, so a row's response
depends on which other rows share its batch. Here each row owns a ``torch.Generator`` seeded from
``row_seed(seed, step, prompt_id, sample_index)`` and samples by the Gumbel-max trick
(argmax(logits/T + Gumbel noise) is a draw from softmax(logits/T)); ``RowSampler`` is a logits processor
that makes that choice and hands ``generate`` a score row whose argmax is it, so greedy decoding inside
``generate`` (with its KV cache and every model family's input handling) picks exactly our draw.

It also records log pi_old(token) = log_softmax(logits / T)[token] over the *full* vocabulary (top-k /
top-p truncation is not reflected, as in verl and TRL), which is what a teacher-forced forward of the same
model at the same temperature computes, so the first importance ratio of a step is exactly 1.

vLLM gets the same ``row_seed`` as its per-request seed (its draws differ from ours, but are reproducible).
"""

from __future__ import annotations

import hashlib

import torch

from mmrlvr.rollout.base import SamplingParams


def row_seed(seed: int, step: int, prompt_id: str, sample_index: int) -> int:
    """A 63-bit seed for one response, stable across processes and Python versions (no ``hash()``)."""
    key = f"mmrlvr/{seed}/{step}/{prompt_id}/{sample_index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / nucleus top-p set to -inf (at least one token is always kept).

    logits: [N, V] (already divided by the temperature). Returns a new [N, V] tensor.
    """
    out = logits.clone()
    if top_k and 0 < top_k < out.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[:, -1:]  # [N, 1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)  # [N, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # the top token has before = 0, so it always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def gumbel_noise(generator: torch.Generator, vocab: int, positions: int | None = None) -> torch.Tensor:
    """Standard Gumbel noise from one row's generator (on the generator's device): [V], or [positions, V]
    for that many consecutive positions (on a CPU generator the same stream as that many [V] draws)."""
    shape = (vocab,) if positions is None else (positions, vocab)
    u = torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float64)
    u = u.clamp_(min=1e-20, max=1.0 - 1e-16)
    return (-torch.log(-torch.log(u))).float()


class RowSampler:
    """Logits processor for ``generate(do_sample=False)`` that samples each row with its own generator.

    Records, per call (= per generated position), the chosen tokens [N] and their log-probs [N] under
    log_softmax(logits / temperature). Rows that already finished are still "sampled" (``generate``
    replaces their token with padding); the engine masks those positions.
    """

    def __init__(self, seeds: list[int], params: SamplingParams, device: torch.device | str = "cpu",
                 banned_ids: list[int] | None = None) -> None:
        if params.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {params.temperature}")
        self.params = params
        # never sampled (vision placeholders: a response holding <|image_pad|> cannot be teacher-forced);
        # like top-k/top-p, the ban shapes the draw but not the recorded full-vocabulary log-probs
        self.banned_ids = list(banned_ids or [])
        gen_device = torch.device(device)
        if gen_device.type not in ("cpu", "cuda"):  # e.g. mps: draw the noise on the CPU
            gen_device = torch.device("cpu")
        self.generators = []
        for s in seeds:
            g = torch.Generator(device=gen_device)
            g.manual_seed(s)
            self.generators.append(g)
        self.tokens: list[torch.Tensor] = []  # each [N]
        self.logprobs: list[torch.Tensor] = []  # each [N]
        self._noise: torch.Tensor | None = None  # [ahead, N, V] Gumbel noise drawn ahead (CPU generators)
        self._noise_at = 0

    def _next_noise(self, vocab: int, device: torch.device) -> torch.Tensor:
        """[N, V] Gumbel noise for this position, each row from its own generator.

        A CPU generator's ``rand(k * V)`` is the same stream as k calls of ``rand(V)`` (checked in
        tests/test_rollout_hf.py), so CPU rows draw several positions at once: one call per row
        every ``ahead`` positions instead of every position (at the toy's 128 rows x 558 tokens the
        per-position loop was a quarter of generation time). The budget keeps the float64 draw under
        ~32 MB. CUDA's Philox streams do not split that way, so CUDA rows draw one position at a time.
        """
        if self._noise is None or self._noise_at >= self._noise.shape[0]:
            n = len(self.generators)
            on_cpu = all(g.device.type == "cpu" for g in self.generators)
            ahead = max(1, min(self.params.max_new_tokens, (1 << 22) // max(1, n * vocab))) if on_cpu else 1
            self._noise = torch.stack([gumbel_noise(g, vocab, ahead) for g in self.generators], dim=1)  # [ahead, N, V]
            self._noise_at = 0
        noise = self._noise[self._noise_at]
        self._noise_at += 1
        return noise.to(device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.params.temperature  # [N, V]
        logprobs = torch.log_softmax(logits, dim=-1)
        allowed = logits
        if self.banned_ids:
            allowed = logits.clone()
            allowed[:, self.banned_ids] = float("-inf")
        if self.params.greedy:
            chosen = allowed.argmax(dim=-1)  # [N]
        else:
            filtered = filter_logits(allowed, self.params.top_k, self.params.top_p)
            noise = self._next_noise(logits.shape[-1], logits.device)
            chosen = (filtered + noise).argmax(dim=-1)  # [N]; -inf + noise stays -inf
        self.tokens.append(chosen)
        self.logprobs.append(logprobs.gather(-1, chosen[:, None]).squeeze(-1))
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, chosen[:, None], 0.0)
