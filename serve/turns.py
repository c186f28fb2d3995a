"""Pure request/turn logic of the Proxy: session identity, clawray fields, Turn records (next states:
serve/history.py)."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from core.contracts import Turn, TurnType, tool_names
from core.text import content_text
from memory.units import SCOPE_CAPS
from serve.history import params_key
from serve.protocol import Reply
from serve.side import DEFAULT_RULES, SideRules, side_reason

# Body fields clawray reads and strips before generation (the same as the X-* headers).
CLAWRAY_FIELDS = ("session_id", "turn_type", "session_done", "user_id", "workspace_id", "memory_scope",
                  "clawray_eval")
HEADER_FIELDS = {
    "session_id": "x-session-id",
    "turn_type": "x-turn-type",
    "session_done": "x-session-done",
    "user_id": "x-user-id",
    "workspace_id": "x-workspace-id",
    "memory_scope": "x-memory-scope",
}
MAX_ID_LEN = 128


class RequestError(ValueError):
    """Bad client input: becomes a 4xx with this message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TurnMeta:
    session_id: str
    turn_type: TurnType
    session_done: bool
    tenant: str
    eval_spec: dict[str, Any] | None
    derived: bool  # the client sent no session id
    params: bytes = b""  # serve/history.py `params_key` of the body: a retry repeats it exactly
    memory_scope: str = "user"  # X-Memory-Scope: the widest memory scope read and written (memory/units.py)
    memories: tuple[str, ...] = ()  # ids of the memory units injected (set by the Proxy after retrieval)
    max_tokens_requested: int | None = None  # the client's output-token limit (serve/budget.py)
    context: dict[str, Any] | None = None  # what context management did (serve/context.py); None: nothing
    tools: tuple[str, ...] = ()  # names of the tools the request offered


def _truthy(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _clean_id(name: str, v: Any) -> str | None:
    if v is None or v == "":
        return None
    s = str(v)
    # ASCII: ids travel back in response headers (X-Session-Id), which HTTP encodes as latin-1 at most.
    if len(s) > MAX_ID_LEN or not (s.isascii() and s.isprintable()):
        raise RequestError(f"{name} must be printable ASCII of at most {MAX_ID_LEN} characters")
    return s


# Session ids agents send of their own accord, without clawray's X-Session-Id (seen in live runs,
# tests/integration/test_agents_live.py): a header (Claude Code's; Codex's `session-id`, older Codex
# `session_id`), or Claude Code's body `metadata.user_id` (JSON text).
AGENT_SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id")


def agent_session_id(headers: dict[str, str], body: dict[str, Any]) -> str | None:
    """The conversation id the agent itself sent (module notes), or None."""
    for name in AGENT_SESSION_HEADERS:
        if headers.get(name):
            return headers[name]
    meta = body.get("metadata")
    user = meta.get("user_id") if isinstance(meta, dict) else None
    if isinstance(user, str) and user.startswith("{"):
        try:
            sid = json.loads(user).get("session_id")
        except (ValueError, AttributeError):
            return None
        return sid if isinstance(sid, str) and sid else None
    return None


def derive_session_id(tenant: str, client_key: str, messages: list[dict[str, Any]],
                      agent_session: str | None = None) -> str:
    """A stable id for clients that send none: the agent's own conversation id when it sends one, else
    the same client + the same conversation start (its leading system prompt and first user message) ->
    the same session. Two different clients (key or address) or two conversations never merge.

    Only the leading system prompt counts: agents also put system messages of their own later in the
    conversation (Claude Code: its environment, after the user's message), which change between requests.
    """
    if agent_session is not None:
        key: list[Any] = [tenant, client_key, "agent-session", agent_session]
    else:
        lead = []
        for m in messages:
            if m.get("role") not in ("system", "developer"):
                break
            lead.append(content_text(m.get("content"), ""))
        first_user = next((content_text(m.get("content"), "") for m in messages if m.get("role") == "user"), "")
        key = [tenant, client_key, "\n".join(lead), first_user]
    return f"derived-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]}"


def extract_meta(body: dict[str, Any], headers: dict[str, str], client_key: str,
                 messages: list[dict[str, Any]] | None = None, side: SideRules = DEFAULT_RULES) -> TurnMeta:
    """Read clawray's fields from headers (preferred) or body, strip them from `body` in place.
    `messages`: the conversation a derived session id is taken from (default: `body["messages"]`; the
    Responses route passes its input as chat messages, serve/responses.py). Without X-Turn-Type, a request
    that `side` recognises as an agent's auxiliary request is a side turn (serve/side.py)."""
    vals = {k: body.pop(k, None) for k in CLAWRAY_FIELDS}
    for field, header in HEADER_FIELDS.items():
        if header in headers:
            vals[field] = headers[header]
    if messages is None:
        messages = body.get("messages") or []
    turn_type = str(vals["turn_type"] or "main").lower()
    if turn_type not in ("main", "side"):
        raise RequestError("X-Turn-Type must be 'main' or 'side'")
    if vals["turn_type"] is None and side_reason(body, messages, side) is not None:
        turn_type = "side"
    eval_spec = vals["clawray_eval"]
    if eval_spec is not None and not isinstance(eval_spec, dict):
        raise RequestError("clawray_eval must be an object")
    user = _clean_id("X-User-Id", vals["user_id"]) or "default"
    if "/" in user:  # the tenant is "<user>/<workspace>": a "/" in the user would make it ambiguous
        raise RequestError("X-User-Id must not contain '/'")
    memory_scope = str(vals["memory_scope"] or "user").lower()
    if memory_scope not in SCOPE_CAPS:
        raise RequestError(f"X-Memory-Scope must be one of {', '.join(SCOPE_CAPS)}")
    workspace = _clean_id("X-Workspace-Id", vals["workspace_id"]) or "default"
    tenant = f"{user}/{workspace}"
    session = _clean_id("X-Session-Id", vals["session_id"])
    return TurnMeta(
        session_id=session or derive_session_id(tenant, client_key, messages, agent_session_id(headers, body)),
        turn_type=TurnType(turn_type),
        session_done=_truthy(vals["session_done"]) if vals["session_done"] is not None else False,
        tenant=tenant,
        eval_spec=eval_spec,
        derived=session is None,
        params=params_key(body),
        memory_scope=memory_scope,
        tools=tuple(tool_names(body.get("tools"))),
    )


def turns_from_reply(
    reply: Reply, meta: TurnMeta, skills: list[str], generation: int, tool_calls: list[list[dict]]
) -> list[Turn]:
    """One Turn per sampled choice; several choices share a `group_id` (GRPO groups).

    Their `prompt_ids` are left empty: the choices share the prompt, which goes to the store once, as JSON
    (`reply.capture.prompt_bytes()`; serve/sessions.py `SessionStore.record`'s `prompt`), so the request path
    never validates and re-serialises its ~3,000 ids per choice. Every turn read from the store has them."""
    cap = reply.capture
    group = uuid.uuid4().hex if len(cap.choices) > 1 else None
    out = []
    for idx in sorted(cap.choices):
        c = cap.choices[idx]
        out.append(
            Turn(
                session_id=meta.session_id,
                turn_index=0,  # assigned by the session store
                tenant=meta.tenant,
                turn_type=meta.turn_type,
                messages=reply.messages,
                prompt_ids=[],
                response_ids=c.token_ids,
                response_logprobs=c.logprobs,
                response_text=c.text,
                tool_calls=tool_calls[idx] if idx < len(tool_calls) else [],
                tools=list(meta.tools),
                finish_reason=c.finish_reason,
                skills=skills,
                memories=list(meta.memories),
                memory_scope=meta.memory_scope,
                skill_generation=generation,
                adapter_version=cap.adapter,
                sampling=cap.sampling,
                max_tokens_requested=meta.max_tokens_requested,
                max_tokens_granted=cap.max_tokens,
                context=meta.context,
                group_id=group,
                group_size=len(cap.choices),
                last_in_session=meta.session_done,
                eval_spec=meta.eval_spec,
            )
        )
    return out


def tool_calls_of(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Per choice, the tool calls of a non-streaming OpenAI body (Anthropic: tool_use blocks)."""
    if "choices" in body:
        return [(c.get("message") or {}).get("tool_calls") or [] for c in body["choices"]]
    blocks = [b for b in body.get("content", []) if b.get("type") == "tool_use"]
    return [[{"id": b.get("id"), "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))}}
             for b in blocks]]


class StreamToolCalls:
    """Accumulates OpenAI streaming `delta.tool_calls` fragments (only parsed when tools were sent)."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[int, dict[str, Any]]] = {}

    def feed(self, chunk: str) -> None:
        if not chunk.startswith("data: {") or '"tool_calls"' not in chunk:
            return
        data = json.loads(chunk[6:])
        for choice in data.get("choices", []):
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                slot = self.calls.setdefault(choice["index"], {}).setdefault(
                    tc.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""

    def result(self, n: int) -> list[list[dict[str, Any]]]:
        return [[c for _, c in sorted(self.calls.get(i, {}).items())] for i in range(n)]


class AnthropicStreamToolUse:
    """Accumulates Anthropic streaming `tool_use` blocks into the OpenAI tool-call shape Turn stores."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}

    def feed(self, event: str) -> None:
        if event.startswith("event: content_block_start") and '"tool_use"' in event:
            data = _sse_json(event)
            block = data.get("content_block") or {}
            self.blocks[data.get("index", 0)] = {
                "id": block.get("id"), "function": {"name": block.get("name") or "", "arguments": ""}}
        elif event.startswith("event: content_block_delta") and '"input_json_delta"' in event:
            data = _sse_json(event)
            slot = self.blocks.get(data.get("index", 0))
            if slot is not None:
                slot["function"]["arguments"] += (data.get("delta") or {}).get("partial_json") or ""

    def result(self, n: int) -> list[list[dict[str, Any]]]:
        return [[c for _, c in sorted(self.blocks.items())]] + [[] for _ in range(n - 1)]


def _sse_json(event: str) -> dict[str, Any]:
    """The JSON of an SSE event's `data:` line (`event: x\\ndata: {...}\\n\\n`)."""
    for line in event.splitlines():
        if line.startswith("data:"):
            return json.loads(line[5:])
    return {}
