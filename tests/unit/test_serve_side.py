"""Side requests of header-less agents (serve/side.py; issue 16 item 5), checked on the request shapes the
real agents sent in interactive use (tests/unit/agent_side_requests.jsonl: excerpts of requests recorded
from Claude Code 2.1.332, Codex 0.171.0, Qwen Code 0.24.4, Hermes Agent 0.19.0, OpenClaw 2026.9.6 and
CoPaw 1.0.2 (`copaw app` driven through its console chat route) by tests/integration/agent_recorder.py;
each text cut after its first ~90 characters, or after the agent's own phrase, and each conversation to
its start and its last three messages; docs/agents.md "Side requests"). Through the Proxy's own path:
each API's view, then extract_meta."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from core.config import ProxyConfig
from serve.apis import CHAT, MESSAGES, RESPONSES
from serve.side import AGENT_SIDE_MARKERS, SideRules, side_reason
from serve.turns import extract_meta
from tests.unit.test_serve_responses_route import (
    _send,
    proxy,  # noqa: F401 - the in-process Proxy fixture
)

RECORDED = [json.loads(line) for line in
            Path(__file__).with_name("agent_side_requests.jsonl").read_text().splitlines()]
APIS = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}


def turn_type(body: dict[str, Any], api: str, headers: dict[str, str] | None = None,
              rules: SideRules | None = None) -> str:
    """What the Proxy makes of this request (serve/proxy.py `_prepare`)."""
    body = copy.deepcopy(body)
    view = APIS[api].view(body)
    args = () if rules is None else (rules,)
    return extract_meta(body, headers or {}, "client", view.get("messages"), *args).turn_type.value


def find(agent: str, request: str) -> dict[str, Any]:
    return next(r for r in RECORDED if r["agent"] == agent and r["request"] == request)


@pytest.mark.parametrize("rec", RECORDED, ids=[f"{r['agent']}: {r['request']}" for r in RECORDED])
def test_each_recorded_request_of_a_real_agent_is_classified_as_it_was_sent(rec):
    assert turn_type(rec["body"], rec["api"]) == rec["expect"]


def test_the_recordings_cover_titles_summaries_and_the_main_loop_of_six_agents():
    agents = {r["agent"] for r in RECORDED}
    assert agents == {"claude-code", "codex", "qwen-code", "hermes", "openclaw", "copaw"}
    for agent in agents:
        kinds = {r["expect"] for r in RECORDED if r["agent"] == agent}
        assert kinds == {"main", "side"}, agent
    # Every built-in marker is one some recorded request was classified by, except the suggestion of
    # Claude Code (the same marker as Qwen Code's; Claude Code's own is off in these builds).
    used = {side_reason(copy.deepcopy(r["body"]), APIS[r["api"]].view(copy.deepcopy(r["body"])).get("messages") or [])
            for r in RECORDED}
    assert set(AGENT_SIDE_MARKERS) <= used


def test_the_clients_turn_type_header_wins_over_the_markers():
    title = find("claude-code", "side: the session title")
    assert turn_type(title["body"], "messages", {"x-turn-type": "main"}) == "main"
    main = find("qwen-code", "main: the first request of a prompt")
    assert turn_type(main["body"], "chat", {"x-turn-type": "side"}) == "side"


def test_a_marker_quoted_inside_a_message_or_a_tool_result_leaves_the_main_loop_main():
    body = copy.deepcopy(find("claude-code", "main: the first request of a prompt")["body"])
    user = next(m for m in reversed(body["messages"]) if m["role"] == "user")
    # The user @-mentions a file that quotes the phrase (this repository's own serve/side.py, say).
    user["content"].append({"type": "text", "text": f'    "{AGENT_SIDE_MARKERS[0]}",\n'})
    assert turn_type(body, "messages") == "main"
    # A tool's output holding the phrase at a line start (the agent ran `cat` on a prompt file).
    user["content"].append({"type": "tool_result", "tool_use_id": "t1", "content": f"{AGENT_SIDE_MARKERS[0]}\n"})
    assert turn_type(body, "messages") == "main"
    chat = copy.deepcopy(find("qwen-code", "main: after its tool call ran")["body"])
    chat["messages"].append({"role": "tool", "tool_call_id": "c1", "content": f"{AGENT_SIDE_MARKERS[2]}\n"})
    assert turn_type(chat, "chat") == "main"
    # A marker in the main system prompt, not at its start (a project instruction file quoting it).
    body["system"][-1]["text"] += f"\n{AGENT_SIDE_MARKERS[1]}"
    assert turn_type(body, "messages") == "main"
    # Only the last user message counts: the user quoting a suggestion prompt earlier is main.
    suggestion = copy.deepcopy(find("qwen-code", "side: the next-prompt suggestion")["body"])
    suggestion["messages"] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    assert turn_type(suggestion, "chat") == "main"


def test_a_system_message_claude_code_puts_after_the_user_is_not_its_system_prompt():
    body = copy.deepcopy(find("claude-code", "main: the first request of a prompt")["body"])
    body["messages"].append({"role": "system", "content": AGENT_SIDE_MARKERS[1]})
    assert turn_type(body, "messages") == "main"


def test_the_markers_and_models_are_the_operators_to_replace_or_extend():
    title = find("claude-code", "side: the session title")["body"]
    assert turn_type(title, "messages", rules=SideRules.build(markers=[])) == "main"
    own = {"model": "m", "messages": [{"role": "system", "content": "Name this chat in three words."},
                                      {"role": "user", "content": "hello"}]}
    assert turn_type(own, "chat") == "main"
    assert turn_type(own, "chat", rules=SideRules.build(extra=["Name this chat"])) == "side"
    assert turn_type(title, "messages", rules=SideRules.build(extra=["Name this chat"])) == "side"  # kept
    # Claude Code names ANTHROPIC_SMALL_FAST_MODEL on its titles (recorded with it set to clawray-fast):
    # with that name reserved, the model alone makes it side, whatever its prompt says.
    fast = find("claude-code", "side: the session title, ANTHROPIC_SMALL_FAST_MODEL=clawray-fast")["body"]
    assert fast["model"] == "clawray-fast"
    rules = SideRules.build(markers=[], models=["clawray-fast"])
    assert turn_type(fast, "messages", rules=rules) == "side"
    main = find("claude-code", "main: the first request of a prompt")["body"]
    assert main["model"] == "clawray-policy" and turn_type(main, "messages", rules=rules) == "main"
    # The config's fields, as the Proxy builds them.
    cfg = ProxyConfig.model_validate({"extra_side_markers": ["Name this chat"], "side_models": ["clawray-fast"]})
    built = SideRules.build(cfg.side_markers, cfg.extra_side_markers, cfg.side_models)
    assert built.markers == (*AGENT_SIDE_MARKERS, "Name this chat") and built.models == {"clawray-fast"}


def test_a_suggestion_sharing_the_conversation_is_served_but_neither_stored_nor_its_next_state(proxy):  # noqa: F811
    """Qwen Code's next-prompt suggestion repeats the main conversation (same system prompt and first user
    message: the same derived session) with its own prompt last. Served without skills, never stored,
    and the turn it follows is completed by the user's real next message, not by the suggestion."""
    main = find("qwen-code", "main: the first request of a prompt")["body"]
    prompt = next(m for m in reversed(find("qwen-code", "side: the next-prompt suggestion")["body"]["messages"])
                  if m["role"] == "user")
    first = {**copy.deepcopy(main), "stream": False}
    assert _send(proxy, CHAT, first).status_code == 200
    (turn,) = proxy.store.turns()
    said = {"role": "assistant", "content": turn.response_text}
    suggest = {**first, "messages": [*first["messages"], said, prompt]}
    assert _send(proxy, CHAT, suggest).status_code == 200
    nxt = {**first, "messages": [*first["messages"], said, {"role": "user", "content": "Explain what a monad is"}]}
    assert _send(proxy, CHAT, nxt).status_code == 200
    bodies = [b for _, b in proxy.engine._target.bodies]
    assert len(bodies) == 3 and "SKILL:" not in json.dumps(bodies[1]) and "SKILL:" in json.dumps(bodies[2])
    turns = proxy.store.turns()
    assert len(turns) == 2 and len({t.session_id for t in turns}) == 1
    assert not any("SUGGESTION MODE" in json.dumps(t.messages) for t in turns)
    done = next(t for t in turns if t.turn_id == turn.turn_id)
    assert done.next_state == [{"role": "user", "content": "Explain what a monad is"}]
