"""The served base model as the PRM judge, through the local engine deployment (no network hop, no capture).

`rewards.judge_source: engine` (the default when no external judge and no checkers are configured): the
judge's votes are chat completions of the *base* model (`model.served_name`, never the adapter being
trained: a policy must not grade itself) on the engine's Serve deployment, called through its handle. The
Proxy is not on this path, so judge calls are never recorded as turns. Same interface as
`core.llm.LLMClient.chat` (what `rewards.scorer.Scorer` calls), same error contract: an engine that is
down, restarting or saturated raises a retryable `LLMError`, which the scorer turns into
`JudgeUnavailable` (the outbox retries the turn later; nothing is scored 0 by accident).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from core.llm import LLMError, LLMUsage

log = logging.getLogger("clawray.rewards.engine_judge")


class EngineJudge:
    """Chat completions from the engine deployment `deployment` of Serve app `app`, model `model`."""

    def __init__(self, deployment: str, app: str, model: str, *, max_concurrency: int = 4,
                 timeout_s: float = 120.0, handle: Any = None) -> None:
        self.deployment, self.app, self.model = deployment, app, model
        self.timeout_s = timeout_s
        self._handle = handle  # tests pass an in-process handle (serve.local_handle.LocalHandle)
        self._sem = asyncio.Semaphore(max_concurrency)
        self.usage = LLMUsage()

    @property
    def where(self) -> str:
        return f"{self.model} on the local engine ({self.app}/{self.deployment})"

    def _engine(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(self.deployment, app_name=self.app)
        return self._handle

    async def close(self) -> None:
        return None

    async def chat(self, messages: Sequence[dict[str, Any]], *, temperature: float = 0.0, max_tokens: int = 512,
                   n: int = 1) -> list[str]:
        """The `n` choices' texts ("" for a choice without text). Raises a retryable LLMError when the
        engine cannot answer now; a non-retryable one when it refuses the request itself."""
        from ray.exceptions import RayActorError, RayTaskError
        from ray.serve.exceptions import BackPressureError, RayServeException

        body = {"model": self.model, "messages": list(messages), "temperature": temperature,
                "max_tokens": max_tokens, "n": n}
        async with self._sem:
            try:
                reply = await asyncio.wait_for(self._engine().chat.remote(body), self.timeout_s)
            except (TimeoutError, RayActorError, BackPressureError, RayServeException) as e:
                self.usage.failures += 1
                raise LLMError(f"{self.where} unavailable: {type(e).__name__}: {str(e)[:200]}",
                               retryable=True) from None
            except Exception as e:  # noqa: BLE001 - the engine refused the request (its EngineRequestError,
                # raised through the handle; rewards/ does not import serve/): not worth retrying
                self.usage.failures += 1
                cause = e.cause if isinstance(e, RayTaskError) and e.cause is not None else e
                if getattr(cause, "status", None) == 503:  # it sleeps while a run trains on its GPU: passes
                    raise LLMError(f"{self.where} unavailable: {str(cause)[:200]}", retryable=True) from None
                raise LLMError(f"{self.where} refused the judge request: {str(cause)[:300]}") from None
        self.usage.calls += 1
        usage = reply.body.get("usage") or {}
        self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
        return [(c.get("message") or {}).get("content") or "" for c in reply.body.get("choices", [])]
