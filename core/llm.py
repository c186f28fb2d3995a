"""The one LLM client every plane uses: judge, evolver, validator, teacher (DESIGN.md "Every LLM call").

`LLMClient(endpoint)` wraps the official `openai.AsyncOpenAI` SDK with:
- a per-request timeout (`endpoint.timeout_s`),
- bounded retries with exponential backoff and jitter (`endpoint.max_retries`, `endpoint.backoff_s`),
  honouring a server's `Retry-After`,
- a concurrency limit (`endpoint.max_concurrency`, an asyncio.Semaphore),
- a usage counter (calls, failures, retries, prompt/completion tokens from `usage`),
- one error type, `LLMError`, whose message names the endpoint and the cause and never the API key.

NOTE: one client per event loop. The semaphore and the SDK's connection pool belong to the loop that
first used them (in a Ray async actor that is the actor's loop).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import openai
from openai import AsyncOpenAI

from core.config import LLMEndpoint

T = TypeVar("T")

# The statuses the SDK itself treats as transient (request timeout, lock conflict, rate limit, 5xx).
RETRY_STATUSES = frozenset({408, 409, 429})
MAX_BACKOFF_S = 8.0
MAX_RETRY_AFTER_S = 60.0
MAX_DETAIL_CHARS = 300


class LLMError(RuntimeError):
    """An LLM call that failed after its retries. `retryable`: a later call may succeed (timeouts,
    connection errors, 408/409/429/5xx); False for requests the server refused as invalid (4xx)."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep status/retryable when the error crosses a Ray process boundary (pickled).
        return (_rebuild_llm_error, (str(self), self.status, self.retryable))


def _rebuild_llm_error(message: str, status: int | None, retryable: bool) -> LLMError:
    return LLMError(message, status=status, retryable=retryable)


@dataclass
class LLMUsage:
    """Counters of one client since it was created (the spend meter: tokens, not currency)."""

    calls: int = 0  # successful requests
    failures: int = 0  # calls that raised LLMError (after retries)
    retries: int = 0  # extra attempts made
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _strip_userinfo(url: str) -> str:
    """`https://user:secret@host/v1` -> `https://host/v1`: URLs end up in error messages."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", url, flags=re.I)


class LLMClient:
    """An OpenAI-compatible endpoint with timeouts, retries, a concurrency limit and usage counters.

    Args:
        endpoint: the endpoint section from the config (judge, evolver, teacher, ...).
        client: an `AsyncOpenAI` to use instead of building one (tests); its own retries should be 0.
    """

    def __init__(self, endpoint: LLMEndpoint, *, client: AsyncOpenAI | None = None):
        self.endpoint = endpoint
        self._key = endpoint.api_key()
        # The SDK's own retries are off: its initial backoff is a module constant, so the configured
        # `backoff_s` could not be honoured; the loop in `_call` does the same retries with it.
        self._client = client or AsyncOpenAI(
            base_url=endpoint.base_url,
            api_key=self._key or "EMPTY",  # local servers take any key; the SDK requires one
            timeout=endpoint.timeout_s,
            max_retries=0,
        )
        self._sem = asyncio.Semaphore(endpoint.max_concurrency)
        self._echo_max_tokens = 0  # lowered to 1 once if a server refuses max_tokens=0
        self.usage = LLMUsage()

    @property
    def where(self) -> str:
        return f"{self.endpoint.model} at {_strip_userinfo(self.endpoint.base_url)}"

    async def close(self) -> None:
        await self._client.close()

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        n: int = 1,
    ) -> list[str]:
        """POST /chat/completions. Returns the `n` choices' texts ("" for a choice without text)."""
        resp = await self._call(
            "chat",
            lambda: self._client.chat.completions.create(
                model=self.endpoint.model,
                messages=list(messages),  # type: ignore[arg-type]
                temperature=temperature,
                max_completion_tokens=max_tokens,
                n=n,
            ),
        )
        self._count(resp.usage)
        return [c.message.content or "" for c in resp.choices]

    async def completion_logprobs(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> list[float]:
        """The endpoint's logprob of each of `response_ids` given `prompt_ids` (nats, shape (R,)).

        One POST /completions with the token ids as the prompt, `echo=True`, `logprobs=1` and
        `max_tokens=0` (1 if the server refuses 0; the extra sampled token is ignored). Raises
        LLMError if the server does not return one logprob per echoed token.
        """
        ids = [*prompt_ids, *response_ids]
        try:
            resp = await self._echo(ids)
        except LLMError as e:
            if e.status != 400 or self._echo_max_tokens != 0:
                raise
            self._echo_max_tokens = 1  # e.g. servers that require max_tokens >= 1
            resp = await self._echo(ids)
        self._count(resp.usage)
        p, r = len(prompt_ids), len(response_ids)
        lp = resp.choices[0].logprobs.token_logprobs if resp.choices[0].logprobs else None
        span = list(lp[p : p + r]) if lp is not None and len(lp) >= p + r else None
        if span is None or any(x is None for x in span):
            got = "none" if lp is None else len(lp)
            raise LLMError(
                f"{self.where}: /completions echo returned {got} prompt logprobs for {p + r} "
                "tokens; the endpoint must support echo=True with logprobs for token-id prompts"
            )
        return [float(x) for x in span]

    async def tokenize(self, text: str) -> list[int]:
        """The endpoint's token ids for `text` (no special tokens), via vLLM's `POST /tokenize`.

        The route lives at the server root, beside `/v1`. Raises LLMError where the endpoint has
        no such route (hosted APIs).
        """
        root = re.sub(r"/v1/?$", "", self.endpoint.base_url.rstrip("/"))
        body = {"model": self.endpoint.model, "prompt": text, "add_special_tokens": False}
        data = await self._call(
            "tokenize", lambda: self._client.post(f"{root}/tokenize", cast_to=dict, body=body)
        )
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise LLMError(f"{self.where}: /tokenize returned no 'tokens' list")
        return [int(t) for t in tokens]

    async def _echo(self, ids: list[int]) -> Any:
        return await self._call(
            "completions",
            lambda: self._client.completions.create(
                model=self.endpoint.model,
                prompt=ids,
                echo=True,
                logprobs=1,
                max_tokens=self._echo_max_tokens,
                temperature=0.0,
            ),
        )

    def _count(self, usage: Any) -> None:
        if usage is not None:
            self.usage.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
            self.usage.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)

    async def _call(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        """Run `make()` under the concurrency limit with bounded retries; LLMError when all fail."""
        attempts = self.endpoint.max_retries + 1
        for attempt in range(attempts):
            try:
                async with self._sem:
                    result = await make()
                self.usage.calls += 1
                return result
            except openai.APIStatusError as e:
                status, retryable = e.status_code, e.status_code in RETRY_STATUSES or e.status_code >= 500
                detail, retry_after = self._detail(e), _retry_after(e.response.headers)
            except openai.APIConnectionError as e:  # includes APITimeoutError
                status, retryable, retry_after = None, True, None
                detail = "timed out" if isinstance(e, openai.APITimeoutError) else "connection failed"
            if not retryable or attempt == attempts - 1:
                break
            self.usage.retries += 1
            await asyncio.sleep(self._delay(attempt, retry_after))
        self.usage.failures += 1
        # Raised without the SDK exception as cause: that one carries the request and its
        # Authorization header, which must not travel into logs or across Ray.
        raise LLMError(
            f"{what} {self.where} failed after {attempt + 1} attempt(s): {detail}",
            status=status,
            retryable=retryable,
        ) from None

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None and 0 < retry_after <= MAX_RETRY_AFTER_S:
            return retry_after
        base = min(self.endpoint.backoff_s * 2.0**attempt, MAX_BACKOFF_S)
        return base * (1 - 0.25 * random.random())  # jitter spreads retries of concurrent callers

    def _detail(self, e: openai.APIStatusError) -> str:
        text = f"HTTP {e.status_code}: {e.message}"
        if self._key:
            text = text.replace(self._key, "***")
        return text[:MAX_DETAIL_CHARS]


def _retry_after(headers: Any) -> float | None:
    try:
        return float(headers.get("retry-after")) if headers.get("retry-after") else None
    except (TypeError, ValueError):  # an HTTP date or garbage: use our own backoff
        return None
