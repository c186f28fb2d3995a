"""Context management at the Proxy: the budget of each request, where each client API keeps its
conversation, the optional summary of what was dropped, and the room left for injection.

The policy itself is pure (serve/context.py). Here, per request: the reply's room is the client's output
limit, at most `proxy.context.reply_reserve_tokens` (the engine grants what the prompt leaves,
serve/budget.py); main turns also keep `injection_reserve_tokens` for the skills and memory injected
after fitting, and those never take more than `injection_room` (the context minus the reply's room minus
the fitted prompt). Tokens are counted with the served model's tokenizer when it is local (memory/budget.py
`make_counter`), else estimated conservatively.

`summarize`: the turns the policy dropped are summarised by `proxy.context.summarizer` through the one LLM
client (core/llm.py) and the summary goes into the system prompt, where vLLM renders it as the leading
system message; room for it (`summary_max_tokens`) is kept when fitting. A summariser that fails leaves the
request trimmed (the turn's record says so): serving never waits on, or fails with, a summary.
"""

from __future__ import annotations

import logging
from typing import Any

from core.config import ContextConfig
from memory.budget import TokenCounter, make_counter
from serve.budget import OUTPUT_FIELDS, requested_output_tokens
from serve.context import MESSAGE_OVERHEAD, Budget, conversation_tokens, fit, plain_text
from serve.injection import add_to_system

log = logging.getLogger("clawray.context")

# Per client API (serve/apis.py): the conversation's field, its shape (serve/context.py) and the field of
# a system prompt kept outside the conversation.
FIELDS = {"chat": ("messages", "openai", None), "messages": ("messages", "anthropic", "system"),
          "responses": ("input", "responses", "instructions")}
SUMMARY_HEADER = "## Earlier in this conversation (summarised by clawray; the messages were dropped to fit)"
SUMMARY_PROMPT = ("Summarise the conversation excerpt below for the assistant that continues it: the user's "
                  "goals and constraints, decisions made, tool results that still matter (names, paths, "
                  "numbers), and what is left to do. Be brief and factual; write no preamble.")
MAX_TRANSCRIPT_CHARS = 48_000  # cut before counting; then `summary_input_tokens` (the newest part is kept)


class ContextManager:
    def __init__(self, cfg: ContextConfig, context_len: int, counter: TokenCounter, summarizer: Any = None):
        """`summarizer`: anything with `core.llm.LLMClient`'s async `chat` (required by `summarize`)."""
        self.cfg, self.context_len, self.counter, self.summarizer = cfg, context_len, counter, summarizer

    @classmethod
    def from_args(cls, cfg: ContextConfig, args: dict[str, Any] | None) -> ContextManager | None:
        """From what the composition root binds (`context_args` in cluster/serve_app.py): the context
        length (None: unknown, upstream without `context_tokens`: no context management) and the
        served model's folder for its tokenizer (None: estimated counts)."""
        if not args or not args.get("context_len"):
            return None
        client = None
        if cfg.policy == "summarize":
            from core.llm import LLMClient

            client = LLMClient(cfg.summarizer)
        return cls(cfg, int(args["context_len"]), make_counter(args.get("tokenizer_path")), client)

    def reply_room(self, body: dict[str, Any], api_name: str) -> int:
        asked = requested_output_tokens(body, OUTPUT_FIELDS[api_name])
        reserve = self.cfg.reply_reserve_tokens
        return reserve if asked is None else max(0, min(asked, reserve))

    def budget(self, body: dict[str, Any], api_name: str, main: bool) -> Budget:
        reserve = self.cfg.injection_reserve_tokens if main else 0
        if self.cfg.policy == "summarize":
            reserve += self.cfg.summary_max_tokens + self.counter.count(SUMMARY_HEADER) + MESSAGE_OVERHEAD
        return Budget(self.context_len, self.reply_room(body, api_name), reserve)

    def prompt_tokens(self, body: dict[str, Any], api_name: str) -> int:
        """Estimated prompt tokens of `body` as it stands (serve/context.py `conversation_tokens`)."""
        field, shape, system = FIELDS[api_name]
        conv = body.get(field)
        conv = conv if isinstance(conv, list) else [{"role": "user", "content": conv or ""}]
        return conversation_tokens(conv, shape, self.counter, body.get(system) if system else None,
                                   body.get("tools"))

    def injection_room(self, body: dict[str, Any], api_name: str) -> int:
        """Tokens the skills and memory may still take: what the prompt leaves after the reply's room."""
        return self.context_len - self.reply_room(body, api_name) - self.prompt_tokens(body, api_name)

    def skill_fits(self, room: int):
        """The predicate the skill injector keeps its block within `room` with (serve/injection.py)."""
        return lambda block: self.counter.count(block) + MESSAGE_OVERHEAD <= room

    async def fit(self, body: dict[str, Any], api_name: str, main: bool) -> dict[str, Any] | None:
        """Fit `body`'s conversation in place (module rules); returns what was done (None: nothing).
        Raises RequestError(400) when the latest input alone does not fit (serve/context.py)."""
        field, shape, system = FIELDS[api_name]
        conv = body.get(field)
        if self.cfg.policy == "off" or not isinstance(conv, list):  # a text `input` is one message
            return None
        fitted = fit(conv, self.budget(body, api_name, main), self.counter, shape=shape,
                     system=body.get(system) if system else None, tools=body.get("tools"), policy=self.cfg.policy)
        if fitted.record is None:
            return None
        body[field] = fitted.messages
        if self.summarizer is not None and fitted.dropped:
            summary = await self._summary(fitted.dropped)
            fitted.record["summarized"] = summary is not None
            if summary is not None:
                _add_system(body, api_name, f"{SUMMARY_HEADER}\n{summary}")
        log.info("context fitted: %s", fitted.record)
        return fitted.record

    async def _summary(self, dropped: list[Any]) -> str | None:
        from core.llm import LLMError

        transcript = "\n\n".join(f"{_role(m)}: {plain_text(m)}" for m in dropped)[-MAX_TRANSCRIPT_CHARS:]
        while len(transcript) > 64 and self.counter.count(transcript) > self.cfg.summary_input_tokens:
            transcript = transcript[len(transcript) // 10:]  # the newest part: within the summariser's context
        try:
            (text,) = await self.summarizer.chat(
                [{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": transcript}],
                max_tokens=self.cfg.summary_max_tokens)
        except LLMError as e:
            log.warning("context summary failed (%s); the request goes on trimmed", e)
            return None
        words = text.strip().split(" ")
        while words and self.counter.count(" ".join(words)) > self.cfg.summary_max_tokens:
            words = words[: len(words) * 9 // 10]  # another tokenizer's count may differ: cut to fit ours
        return " ".join(words) or None


def _role(m: Any) -> str:
    return str(m.get("role") or m.get("type") or "item") if isinstance(m, dict) else "item"


def _add_system(body: dict[str, Any], api_name: str, block: str) -> None:
    if api_name == "responses":
        body["instructions"] = f"{body['instructions']}\n\n{block}" if body.get("instructions") else block
    else:
        add_to_system(body, block, api_name == "messages")

