"""Context management on the Proxy's request path (serve/context_manager.py; issue 16 item 4), in-process
over a fake engine: a long conversation reaches the engine fitted and the turn records what was done;
one whose latest message cannot fit is a 400 in the API's own error shape that reaches no engine;
injected skills never push a request over the context; the summary policy needs a real summariser.
tests/integration/test_serve_context.py runs the same path against real vLLM."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from core.config import ClawrayConfig, ContextConfig, SkillsConfig, config_from_dict
from core.contracts import Skill
from core.llm import LLMError
from evolve.bank import SkillBank
from memory.budget import EstimatedCounter
from serve.apis import CHAT, MESSAGES
from serve.capture import Capture, ChoiceCapture
from serve.context_manager import SUMMARY_HEADER, ContextManager
from serve.injection import add_to_system
from serve.local_handle import LocalHandle
from serve.protocol import Reply
from serve.proxy import ProxyImpl
from tests.unit.test_memory_injection import store  # noqa: F401 - the memory store fixture
from tests.unit.test_serve_responses_route import _request

CONTEXT = 1024
COUNT = EstimatedCounter()  # what a Proxy without the model's tokenizer counts with


class Engine:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def _reply(self, body: dict[str, Any], out: dict[str, Any]) -> Reply:
        self.bodies.append(copy.deepcopy(body))
        cap = Capture(key="k", prompt_ids=[1, 2, 3], done=True, max_tokens=10)
        cap.choices[0] = ChoiceCapture(0, [7], [-0.1], "ok", "stop")
        return Reply(out, cap, body["messages"])

    async def chat(self, body: dict[str, Any]) -> Reply:
        return self._reply(body, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]})

    async def messages(self, body: dict[str, Any]) -> Reply:
        return self._reply(body, {"type": "message", "content": [{"type": "text", "text": "ok"}]})


def make_proxy(tmp_path, skills: dict | None = None, **context) -> ProxyImpl:
    proxy = {"context": context} if context else {}
    impl = ProxyImpl(LocalHandle(Engine()), proxy, skills or {"enabled": False}, str(tmp_path),
                     context={"context_len": CONTEXT, "tokenizer_path": None})
    impl._started = True
    return impl


def send(proxy: ProxyImpl, api, body: dict[str, Any], **headers: str):
    return asyncio.run(proxy.handle(_request(body, **headers), api))


def long_chat(steps: int = 30) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                  {"role": "user", "content": "Fix the failing test."}]
    for i in range(steps):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i} of the file\n" * 15}]
    return {"model": "m", "messages": msgs, "max_tokens": 32000}


def test_a_long_conversation_reaches_the_engine_fitted_and_the_turn_records_it(tmp_path):
    proxy = make_proxy(tmp_path)
    body = long_chat()
    assert proxy.context.prompt_tokens(body, "chat") > 3 * CONTEXT
    r = send(proxy, CHAT, body, x_session_id="s1")
    assert r.status_code == 200
    (sent,) = proxy.engine._target.bodies
    assert proxy.context.prompt_tokens(sent, "chat") <= CONTEXT - 256 - 512  # reply room and injection reserve
    assert sent["messages"][:2] == body["messages"][:2] and sent["messages"][-1] == body["messages"][-1]
    assert sent["max_tokens"] == 32000  # the client's limit is the engine's business (serve/budget.py)
    (turn,) = proxy.store.turns("s1")
    rec = turn.context
    assert rec["policy"] == "trim" and rec["limit"] == CONTEXT - 256 - 512
    assert rec["tokens_after"] <= rec["limit"] < rec["tokens_before"] and rec["dropped_messages"] > 0
    assert turn.messages == sent["messages"]  # what the engine saw


def test_side_turns_are_fitted_too_without_the_injection_reserve(tmp_path):
    proxy = make_proxy(tmp_path)
    r = send(proxy, CHAT, long_chat(), x_turn_type="side")
    assert r.status_code == 200
    assert CONTEXT - 256 - 512 < proxy.context.prompt_tokens(proxy.engine._target.bodies[0], "chat") <= CONTEXT - 256


def test_a_latest_message_too_long_for_the_context_is_a_400_that_reaches_no_engine(tmp_path):
    proxy = make_proxy(tmp_path)
    huge = "word " * 2000
    for api, body in ((CHAT, {"model": "m", "messages": [{"role": "user", "content": huge}]}),
                      (MESSAGES, {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": huge}]})):
        r = send(proxy, api, body)
        error = json.loads(r.body)
        message = error["error"]["message"]
        assert r.status_code == 400 and f"maximum context length is {CONTEXT} tokens" in message
        assert (error.get("type") == "error") == (api is MESSAGES)  # each API's own error shape
    assert proxy.engine._target.bodies == [] and proxy.store.stats() == {"sessions": 0}


def test_policy_off_sends_the_conversation_as_it_came(tmp_path):
    proxy = make_proxy(tmp_path, policy="off")
    body = long_chat()
    send(proxy, CHAT, copy.deepcopy(body))
    assert proxy.engine._target.bodies[0]["messages"] == body["messages"]


def test_anthropic_conversations_are_fitted_with_their_system_prompt_kept(tmp_path):
    proxy = make_proxy(tmp_path)
    msgs = [{"role": "user", "content": "Fix it."}]
    for i in range(10):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "read", "input": {}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                               "content": "x = 1\n" * 50}]}]
    body = {"model": "m", "max_tokens": 32000, "system": "Be careful.", "messages": msgs}
    assert send(proxy, MESSAGES, body).status_code == 200
    (sent,) = proxy.engine._target.bodies
    assert sent["system"] == "Be careful." and sent["messages"][0] == msgs[0] and sent["messages"][-1] == msgs[-1]
    assert proxy.context.prompt_tokens(sent, "messages") <= CONTEXT - 256 - 512


BIG = Skill(name="big-checklist", category="general", description="A long checklist for fixing tests.",
            body="Check every failing test carefully before changing code. " * 20)
SMALL = Skill(name="small-tip", category="general", description="Run the failing test first.", body="Run it.")


def test_injected_skills_take_only_the_room_the_prompt_and_reply_leave(tmp_path):
    cfg = SkillsConfig(retrieval="template")
    SkillBank(tmp_path / "skills", cfg).add_batch([BIG, SMALL])
    proxy = make_proxy(tmp_path, skills=cfg.model_dump(), injection_reserve_tokens=0)
    ask = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "fix the failing test"}]}
    send(proxy, CHAT, copy.deepcopy(ask))  # room for both
    roomy = proxy.engine._target.bodies[-1]["messages"][0]["content"]
    assert "big-checklist" in roomy and "small-tip" in roomy
    filler = {"role": "user", "content": "fill " * 1600}  # ~ 2,700 estimated tokens: room for the tip only
    tight = {**ask, "max_tokens": 100, "messages": [filler, {"role": "assistant", "content": "ok"}, *ask["messages"]]}
    context = proxy.context.prompt_tokens(tight, "chat") + 100 + 60
    proxy.context.context_len = context
    send(proxy, CHAT, copy.deepcopy(tight))
    sent = proxy.engine._target.bodies[-1]
    assert "small-tip" in sent["messages"][0]["content"] and "big-checklist" not in sent["messages"][0]["content"]
    assert proxy.context.prompt_tokens(sent, "chat") + 100 <= context  # never over the context


class Summariser:
    def __init__(self, fail: bool = False):
        self.fail, self.calls = fail, []

    async def chat(self, messages, *, max_tokens: int = 512, **kw) -> list[str]:
        self.calls.append(messages)
        if self.fail:
            raise LLMError("summariser at http://x: 503", status=503, retryable=True)
        return ["The user asked to fix a test; files c0..c5 were read."]


@pytest.mark.parametrize("fail", [False, True])
def test_summarize_puts_a_summary_of_the_dropped_turns_in_the_system_prompt(fail):
    cfg = ContextConfig(policy="summarize", summarizer={"base_url": "http://x/v1", "model": "s"})
    manager = ContextManager(cfg, CONTEXT, COUNT, Summariser(fail))
    body = long_chat(30)
    record = asyncio.run(manager.fit(body, "chat", main=True))
    system = body["messages"][0]["content"]
    assert record["dropped_messages"] > 0 and record["summarized"] is (not fail)
    assert (SUMMARY_HEADER in system) is (not fail) and system.startswith("You are a coding agent.")
    assert "line 0 of the file" in manager.summarizer.calls[0][1]["content"]  # it read what was dropped
    assert manager.prompt_tokens(body, "chat") <= CONTEXT - 256 - 512


def test_the_summariser_is_sent_only_the_newest_part_of_what_was_dropped_within_its_input_limit():
    cfg = ContextConfig(policy="summarize", summarizer={"base_url": "http://x/v1", "model": "s"},
                        summary_input_tokens=200)
    manager = ContextManager(cfg, CONTEXT, COUNT, Summariser(False))
    body = long_chat(30)
    record = asyncio.run(manager.fit(body, "chat", main=True))
    sent = manager.summarizer.calls[0][1]["content"]
    assert record["summarized"] and 0 < COUNT.count(sent) <= 200
    assert "of the file" in sent and "line 0 of the file" not in sent  # the newest dropped, not the oldest


def test_summarize_without_a_summariser_is_a_config_error_and_context_follows_the_engine():
    with pytest.raises(ValidationError, match="summarizer"):
        ContextConfig(policy="summarize")
    from cluster.serve_app import context_args

    local = config_from_dict({"model": {"max_model_len": 2048}})
    assert context_args(local)["context_len"] == 2048
    assert context_args(config_from_dict({"model": {"max_model_len": 2048},
                                          "proxy": {"context": {"context_tokens": 9000}}}))["context_len"] == 2048
    up = {"engine": {"backend": "upstream", "upstream": {"base_url": "http://u/v1", "model": "m"}}}
    assert context_args(config_from_dict(up)) == {"context_len": None, "tokenizer_path": None}
    up["proxy"] = {"context": {"context_tokens": 128000}}
    assert context_args(config_from_dict(up))["context_len"] == 128000
    assert ContextManager.from_args(ContextConfig(), {"context_len": None}) is None
    assert isinstance(ClawrayConfig().proxy.context, ContextConfig)


def test_the_reply_room_is_the_clients_limit_at_most_the_reserve():
    manager = ContextManager(ContextConfig(), CONTEXT, COUNT)
    assert manager.reply_room({"max_tokens": 32000}, "messages") == 256
    assert manager.reply_room({"max_completion_tokens": 40, "max_tokens": 900}, "chat") == 40
    assert manager.reply_room({}, "responses") == 256 and manager.reply_room({"max_output_tokens": 9}, "responses") == 9
    assert manager.budget({}, "chat", main=False).reserve == 0 and manager.budget({}, "chat", main=True).reserve == 512


def test_memory_takes_only_what_the_shared_room_leaves_after_the_skills(store):  # noqa: F811
    from tests.unit.test_memory_injection import Words, body, injector

    inj = injector(store)
    skills = "## Active Skills\n" + "skill " * 20
    free = body()
    _, full = asyncio.run(inj.inject(free, False, "alice/w", "s1", "user", 0))
    assert full > 20
    for room in (21 + 8 + full // 2, 21 + 8, 0):
        b = body()
        mark = inj.mark(b, False)
        add_to_system(b, skills, False)
        ids, tokens = asyncio.run(inj.inject(b, False, "alice/w", "s1", "user", mark, room))
        assert tokens <= max(0, room - Words().count(skills) - 8) and (tokens == 0) == (not ids)
    assert tokens == 0
