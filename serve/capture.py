"""Token-exact capture of what the engine rendered and sampled (DESIGN.md "Token exactness").

vLLM's serving layer (OpenAI chat, Anthropic messages, streaming or not, tool parsing) calls
`engine_client.generate(prompt, sampling_params, request_id, lora_request=...)`. `TappedEngineClient`
wraps the engine client handed to those serving objects and tees every `RequestOutput` of requests we
registered into a `Capture`: the prompt ids the engine rendered, the ids it sampled, its own logprob of
each sampled id, and the sampling parameters it ran, the output-token limit included (read from the
actual `SamplingParams`, so server defaults and the context clamp count too). vLLM's Responses layer
calls the same `generate`, so Responses turns are captured the same way. The engine runs with
`logprobs_mode=processed_logprobs` (serve/vllm_engine.py), so each logprob is the token's under the
distribution it was sampled from (after temperature, top-k, top-p), which is what the trainer's
importance ratio divides by. Nothing is parsed back out of SSE text
and nothing is re-tokenized, whatever the protocol or stream format.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_json

from core.contracts import Sampling


@dataclass
class ChoiceCapture:
    index: int
    token_ids: list[int] = field(default_factory=list)  # (R,) sampled ids
    logprobs: list[float] = field(default_factory=list)  # (R,) engine logprob per sampled id
    text: str = ""
    finish_reason: str | None = None


@dataclass
class Capture:
    """Everything the engine reported for one request (all its choices)."""

    key: str  # our request key; the engine's request id contains it
    prompt_ids: list[int] = field(default_factory=list)  # (P,)
    # The same ids as the JSON array an upstream sent (`prompt_ids` is then empty): kept as that text from
    # the reply to the store, never parsed into ~3,000 ints, validated and written again on the request
    # path (~0.15 ms per request with an instant upstream; docs/serving.md).
    prompt_json: bytes | None = None
    choices: dict[int, ChoiceCapture] = field(default_factory=dict)
    adapter: str | None = None  # LoRA name the engine ran (None = base)
    sampling: Sampling = field(default_factory=Sampling)  # what every choice was sampled with
    max_tokens: int | None = None  # the output-token limit the engine ran (granted: serve/budget.py)
    done: bool = False

    def prompt_count(self) -> int:
        if self.prompt_json is None:
            return len(self.prompt_ids)
        return self.prompt_json.count(b",") + 1 if self.prompt_json.strip(b"[] ") else 0

    def prompt_bytes(self) -> bytes:
        """The prompt ids as a JSON array, as the store keeps them."""
        return self.prompt_json if self.prompt_json is not None else to_json(self.prompt_ids)

    def choice(self, index: int) -> ChoiceCapture:
        c = self.choices.get(index)
        if c is None:
            c = self.choices[index] = ChoiceCapture(index=index)
        return c


def _sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """Pick the sampled id's logprob at each position (vLLM returns it in every position's dict)."""
    if logprobs is None:
        return []
    return [float(pos[tid].logprob) for tid, pos in zip(token_ids, logprobs, strict=True)]


def sampling_of(params: Any) -> Sampling:
    """The `Sampling` record of a vLLM `SamplingParams` as the engine runs it (vLLM already reset top-k
    and top-p for a greedy request; its top_k of -1 or 0 both mean off)."""
    return Sampling(temperature=float(params.temperature), top_p=float(params.top_p),
                    top_k=max(int(params.top_k), 0))


def absorb(cap: Capture, out: Any, delta: bool) -> None:
    """Fold one vLLM `RequestOutput` into `cap`. `delta`: outputs carry only new tokens."""
    if not cap.prompt_ids and out.prompt_token_ids is not None:
        cap.prompt_ids = list(out.prompt_token_ids)
    for o in out.outputs:
        c = cap.choice(o.index)
        ids = list(o.token_ids)
        lps = _sampled_logprobs(ids, o.logprobs)
        if delta:
            c.token_ids.extend(ids)
            c.logprobs.extend(lps)
            c.text += o.text or ""
        else:  # cumulative / final-only: the whole output so far
            c.token_ids, c.logprobs, c.text = ids, lps, o.text or ""
        if o.finish_reason is not None:
            c.finish_reason = o.finish_reason
    if out.finished:
        cap.done = True


class TappedEngineClient:
    """Delegates everything to vLLM's engine client; `generate` also feeds registered captures.

    NOTE: the sampled-token logprob is forced on (`logprobs=0` when the client asked none): vLLM's
    serving layer decides from the *request* whether to show logprobs, so clients see no change.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._captures: dict[str, Capture] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def register(self, key: str) -> Capture:
        cap = self._captures[key] = Capture(key=key)
        return cap

    def release(self, key: str) -> None:
        self._captures.pop(key, None)

    def _find(self, request_id: str) -> Capture | None:
        # The serving layer prefixes ("chatcmpl-") and may suffix our id; keys are uuid hex.
        for key, cap in self._captures.items():
            if key in request_id:
                return cap
        return None

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any):
        cap = self._find(request_id)
        if cap is None:
            async for out in self._inner.generate(prompt, sampling_params, request_id, *args, **kwargs):
                yield out
            return
        if getattr(sampling_params, "logprobs", None) is None:
            sampling_params = copy.copy(sampling_params)
            sampling_params.logprobs = 0
        lora = kwargs.get("lora_request")
        cap.adapter = lora.lora_name if lora is not None else None
        cap.sampling = sampling_of(sampling_params)
        cap.max_tokens = sampling_params.max_tokens
        from vllm.sampling_params import RequestOutputKind

        delta = sampling_params.output_kind == RequestOutputKind.DELTA
        async for out in self._inner.generate(prompt, sampling_params, request_id, *args, **kwargs):
            absorb(cap, out, delta)
            yield out
