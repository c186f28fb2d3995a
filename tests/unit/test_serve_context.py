"""Context management, the pure policy (serve/context.py; issue 16 item 4): a conversation that outgrows
the context is fitted (oldest tool results shortened, then oldest turns and steps dropped) with tool calls
and results still paired, the system prompt and the latest input kept, in each client API's shape; a
request that fits is passed on untouched; one whose latest message alone cannot fit is a clear 400."""

from __future__ import annotations

import copy
import json
import random

import pytest

from serve.context import MARKER, Budget, conversation_tokens, fit, fixed_tokens, kind
from serve.turns import RequestError


class Words:
    def count(self, text: str) -> int:
        return len(text.split())


W = Words()
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def blob(n: int, tag: str = "x") -> str:
    return " ".join([tag] * n)


def call(cid: str, path: str = "a.py") -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": "read",
                                                                       "arguments": json.dumps({"path": path})}}]}


def result(cid: str, n: int) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": blob(n, cid)}


def agent_task(steps: int = 6, size: int = 200) -> list[dict]:
    """One user task answered by a chain of tool calls, the last result being the latest input."""
    msgs = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    for i in range(steps):
        msgs += [call(f"c{i}"), result(f"c{i}", size)]
    return msgs


def tokens(msgs: list, shape: str = "openai", **kw) -> int:
    return conversation_tokens(msgs, shape, W, **kw)


def assert_paired(msgs: list) -> None:
    """Every tool call has its result and every result its call (what chat templates require)."""
    calls = {tc["id"] for m in msgs for tc in m.get("tool_calls") or []}
    results = {m["tool_call_id"] for m in msgs if m["role"] == "tool"}
    assert calls == results


def test_a_conversation_that_fits_is_passed_on_as_the_very_same_list():
    msgs = agent_task(3, 20)
    frozen = json.dumps(msgs)
    out = fit(msgs, Budget(context=tokens(msgs, tools=TOOLS) + 300, reply=300), W, tools=TOOLS)
    assert out.messages is msgs and out.record is None and json.dumps(out.messages) == frozen


def test_the_oldest_tool_results_are_shortened_first_keeping_their_call_ids():
    msgs = agent_task(6, 200)
    before = json.dumps(msgs)
    limit = tokens(msgs) - 300  # two shortened results are enough
    out = fit(msgs, Budget(context=limit + 100, reply=100), W)
    assert json.dumps(msgs) == before  # never modified in place
    assert len(out.messages) == len(msgs)
    shortened = [m for m in out.messages if m["role"] == "tool" and m["content"].startswith("[clawray")]
    assert [m["tool_call_id"] for m in shortened] == ["c0", "c1"]
    assert shortened[0]["content"] == MARKER.format(n=200)
    assert out.messages[-1] == msgs[-1] and out.messages[:2] == msgs[:2]
    rec = out.record
    assert rec["policy"] == "trim" and rec["shortened_tool_results"] == 2 and rec["dropped_messages"] == 0
    assert rec["tokens_after"] == tokens(out.messages) <= rec["limit"] == limit < rec["tokens_before"]
    assert_paired(out.messages)


def test_the_oldest_turns_go_next_and_the_conversation_still_starts_with_the_user():
    msgs = [SYSTEM]
    for t in range(4):
        msgs += [{"role": "user", "content": f"task {t} " + blob(150)}, call(f"c{t}"), result(f"c{t}", 5),
                 {"role": "assistant", "content": f"done {t}"}]
    msgs.append({"role": "user", "content": "and now?"})
    out = fit(msgs, Budget(context=400, reply=50), W)
    kept = out.messages
    assert kept[0] == SYSTEM and kept[1]["role"] == "user" and kept[-1] == msgs[-1]
    assert kept == [SYSTEM, *msgs[-5:]]  # only the newest earlier turn still fits beside the latest
    assert out.record["dropped_messages"] == len(msgs) - len(kept)
    assert [m["content"] for m in out.dropped][:2] == [msgs[1]["content"], ""]
    assert_paired(kept)
    assert tokens(kept) <= 350


def test_a_single_long_task_keeps_its_task_and_its_latest_steps():
    msgs = agent_task(10, 300)
    out = fit(msgs, Budget(context=900, reply=100), W)
    kept = out.messages
    assert kept[:2] == msgs[:2]  # the system prompt and the task
    assert kept[-2:] == msgs[-2:] and kept[-1]["content"] == msgs[-1]["content"]  # the latest work, whole
    assert kept[2]["role"] == "assistant" and out.record["dropped_messages"] > 0
    assert_paired(kept)
    assert tokens(kept) <= 800


def test_results_shortened_before_a_drop_made_room_are_given_back_whole_newest_first():
    old_turn = [{"role": "user", "content": blob(300)}, {"role": "assistant", "content": "ok"}]
    latest = [{"role": "user", "content": "go"}, call("a"), result("a", 60), call("b"), result("b", 60),
              call("c"), result("c", 5)]
    msgs = [SYSTEM, *old_turn, *latest]
    budget = Budget(context=tokens([SYSTEM, *latest]) - 40, reply=0)  # the latest turn whole is 40 too many
    out = fit(msgs, budget, W)
    assert out.messages[0] == SYSTEM and out.messages[1:3] == latest[:2]
    assert out.messages[3]["content"].startswith("[clawray") and out.messages[5] == latest[4]  # b whole
    assert out.record["shortened_tool_results"] == 1 and out.record["dropped_messages"] == 2


def test_the_pending_turns_exchange_goes_last_so_the_previous_turn_still_finds_its_next_state():
    from serve.history import read_history

    msgs = agent_task(8, 100)  # the previous request ended at c6's result; its reply was call c7
    previous = read_history(msgs[:-2])  # how the session store keyed the previous turn
    key = previous.turn_key("", msgs[-2]["tool_calls"])
    out = fit(msgs, Budget(context=tokens([SYSTEM, msgs[1], *msgs[-4:]]) + 10, reply=0), W)
    assert out.messages[-4:] == msgs[-4:]  # c6's step and result whole, older results shortened or dropped
    assert read_history(out.messages).continuations[key] == [msgs[-1]]  # linked, with its next state
    tighter = fit(msgs, Budget(context=tokens([SYSTEM, msgs[1], *msgs[-2:]]) + 10, reply=0), W)
    assert tighter.messages == [SYSTEM, msgs[1], *msgs[-2:]]  # when nothing else is left, it goes too


def test_a_finished_task_keeps_the_exchange_its_reply_answered_when_the_user_follows_up():
    """The previous request was the agent task; its reply ended the task and the user writes again. The
    task's older steps go before the exchange the reply answered is shortened (seen in the integration
    test: every result shortened, the previous turn lost its next state)."""
    from serve.history import read_history

    task = agent_task(8, 100)
    reply = {"role": "assistant", "content": "done"}
    previous = read_history(task)
    key = previous.turn_key("done", [])
    msgs = [*task, reply, {"role": "user", "content": "thanks, now test it"}]
    budget = Budget(context=tokens([SYSTEM, task[1], *msgs[-4:]]) + 10, reply=0)
    out = fit(msgs, budget, W)
    assert out.messages[-4:] == msgs[-4:]  # c7's step, its result whole, the reply, the follow-up
    assert out.messages[:2] == [SYSTEM, task[1]]  # the task itself stays
    assert_paired(out.messages)
    assert read_history(out.messages).continuations[key] == [msgs[-1]]


def test_anthropic_tool_results_are_blocks_of_user_messages_and_stay_paired_with_their_tool_use():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}]
    for i in range(5):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "read",
                                                    "input": {"path": f"{i}.py"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                               "content": [{"type": "text", "text": blob(200)}]}]}]
    assert kind(msgs[2], "anthropic") == "result" and kind(msgs[0], "anthropic") == "user"
    system = [{"type": "text", "text": "Be careful."}]
    small = fit(msgs, Budget(context=tokens(msgs, "anthropic", system=system) - 150, reply=0), W,
                shape="anthropic", system=system)
    block = small.messages[2]["content"][0]
    assert block == {"type": "tool_result", "tool_use_id": "t0", "content": MARKER.format(n=200)}
    assert small.record["shortened_tool_results"] == 1
    tight = fit(msgs, Budget(context=500, reply=0), W, shape="anthropic", system=system)
    roles = [m["role"] for m in tight.messages]
    assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:], strict=False))  # still alternating
    uses = {b["id"] for m in tight.messages for b in m["content"] if b["type"] == "tool_use"}
    results = {b["tool_use_id"] for m in tight.messages for b in m["content"] if b["type"] == "tool_result"}
    assert uses == results and "t4" in uses and tight.messages[0] == msgs[0]


def test_responses_items_keep_call_ids_and_reasoning_goes_with_its_step():
    items = [{"role": "user", "content": [{"type": "input_text", "text": "fix it"}]}]
    for i in range(4):
        items += [{"type": "reasoning", "id": f"rs{i}", "summary": [{"type": "summary_text", "text": "think"}]},
                  {"type": "function_call", "call_id": f"f{i}", "name": "read", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"f{i}", "output": blob(200)}]
    out = fit(items, Budget(context=tokens(items, "responses") - 100, reply=0), W, shape="responses")
    assert out.messages[3] == {**items[3], "output": MARKER.format(n=200)}
    dropped = fit(items, Budget(context=320, reply=0), W, shape="responses")
    kinds = [i.get("type", "message") for i in dropped.messages]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output"]
    assert dropped.messages[-1] == items[-1]


def test_a_latest_message_that_alone_exceeds_the_context_is_a_400_naming_the_numbers():
    msgs = [SYSTEM, {"role": "user", "content": "old"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": blob(3000)}]
    with pytest.raises(RequestError) as e:
        fit(msgs, Budget(context=2048, reply=256, reserve=512), W)
    assert e.value.status == 400
    assert "2048" in str(e.value) and str(tokens([SYSTEM, msgs[-1]])) in str(e.value)


def test_what_fits_the_context_but_not_the_reserve_is_served_with_less_room_not_refused():
    msgs = [SYSTEM, {"role": "user", "content": "old " + blob(400)}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": blob(1500)}]
    out = fit(msgs, Budget(context=2048, reply=256, reserve=512), W)
    assert out.messages == [SYSTEM, msgs[-1]] and out.record["tokens_after"] > out.record["limit"]


def test_unknown_shapes_are_refused():
    with pytest.raises(ValueError, match="openai, anthropic, responses"):
        fit([], Budget(100, 10), W, shape="gemini")


def test_fixed_parts_are_counted_and_never_fitted():
    assert fixed_tokens(W, system="a b c", tools=TOOLS) > fixed_tokens(W, tools=TOOLS) > fixed_tokens(W) == 0


def _random_conversation(rng: random.Random) -> list[dict]:
    msgs = [SYSTEM] if rng.random() < 0.7 else []
    n = 0
    for _ in range(rng.randint(1, 5)):
        msgs.append({"role": "user", "content": blob(rng.randint(1, 80))})
        for _ in range(rng.randint(0, 4)):
            ids = [f"c{n + j}" for j in range(rng.randint(1, 3))]  # parallel calls
            n += len(ids)
            msgs.append({"role": "assistant", "content": blob(rng.randint(0, 5)), "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "read", "arguments": "{}"}} for i in ids]})
            msgs += [result(i, rng.randint(1, 200)) for i in ids]
        if rng.random() < 0.5:
            msgs.append({"role": "assistant", "content": blob(rng.randint(1, 30))})
    return msgs


def test_any_conversation_is_fitted_or_refused_with_its_invariants_kept():
    rng = random.Random(7)
    for _ in range(300):
        msgs = _random_conversation(rng)
        original = copy.deepcopy(msgs)
        budget = Budget(context=rng.randint(50, 1500), reply=rng.randint(0, 100), reserve=rng.randint(0, 100))
        try:
            out = fit(msgs, budget, W)
        except RequestError:
            continue
        kept = out.messages
        assert msgs == original
        assert_paired(kept)
        assert kept[-1] == msgs[-1]  # the latest input is kept whole
        head = 1 if msgs[0] == SYSTEM else 0
        assert kept[:head] == msgs[:head] and (len(kept) == head + 1 or kept[head]["role"] == "user")
        users = [m for m in msgs if m["role"] == "user"]
        assert users[-1] in kept
        total = tokens(kept)
        assert total <= budget.context and (out.record is None or out.record["tokens_after"] == total)
        if total > budget.limit:  # the limit was out of reach: nothing is left to shorten or drop
            again = fit(kept, budget, W).record
            assert again["shortened_tool_results"] == again["dropped_messages"] == 0
