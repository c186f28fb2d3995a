"""Hostile request bodies on the Proxy's own path (checks, identity, context fitting, injection), in-process
over a fake engine: whatever JSON a client sends, the answer is the engine's reply or a clean 4xx, never an
exception (a 500). tests/integration/test_fuzz.py sends schemathesis' cases to the real app; this runs the
same kind of input through every step before the engine in well under a second per hundred bodies, so a
field the checks forget fails here first. The CI fuzz run found `"tools": <an int>` crashing the context
fitter (a 500): that body is kept below as it was sent."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve.apis import CHAT, MESSAGES, RESPONSES
from serve.local_handle import LocalHandle
from serve.proxy import ProxyImpl
from tests.unit.test_serve_responses_route import FakeEngine, FakeInjector, _request

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3), max_leaves=8)
BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "x"])},
                              optional={"text": JSON, "content": JSON, "input": JSON, "id": JSON, "name": JSON,
                                        "tool_use_id": JSON})
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"])},
                                optional={"content": st.none() | st.text(max_size=20) | st.lists(BLOCK, max_size=3)
                                          | JSON, "tool_calls": JSON, "name": JSON})
OPTIONAL = {"tools": JSON | st.lists(JSON, max_size=2), "system": JSON, "max_tokens": JSON, "tool_choice": JSON,
            "model": JSON, "stop": JSON}
BODY = st.fixed_dictionaries({"messages": st.lists(MESSAGE, min_size=1, max_size=4)}, optional=OPTIONAL)
ITEM = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["message", "function_call",
                                                                     "function_call_output", "reasoning", "x"]),
                                           "role": st.sampled_from(["user", "assistant", "developer", "tool"]),
                                           "content": st.text(max_size=9) | st.lists(BLOCK, max_size=2) | JSON,
                                           "call_id": JSON, "output": JSON, "arguments": JSON, "name": JSON})
RESPONSES_BODY = st.fixed_dictionaries({"input": st.text(max_size=9) | st.lists(ITEM, min_size=1, max_size=3)
                                                 | JSON},
                                       optional={**OPTIONAL, "instructions": JSON, "max_output_tokens": JSON})
# sent by schemathesis in CI (tests/integration/test_fuzz.py), trimmed to the fields that mattered
CI_BODY = {"model": "6", "max_tokens": 16, "system": [{"\U00106d76>": {}}], "tools": -4841166547166,
           "top_p": 0.5178, "messages": [
               {"role": "user", "content": "\x9c\xc4"},
               {"role": "assistant", "content": [{"type": "tool_use", "name": "", "id": "", "input": {}},
                                                 {"type": "tool_result", "tool_use_id": "", "offset": []}]},
               {"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "\x192", "input": {}}]},
               {"role": "assistant", "content": "X"}]}


def _status(proxy, api, body) -> int:
    return asyncio.run(proxy.handle(_request(body), api)).status_code


def make_proxy(root) -> ProxyImpl:
    """Every step before the engine switched on: identity, context fitting, skill injection, recording."""
    impl = ProxyImpl(LocalHandle(FakeEngine()), {}, {"enabled": False}, str(root),
                     context={"context_len": 1024, "tokenizer_path": None})
    impl._started = True
    impl.injector = FakeInjector()
    return impl


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    impl = make_proxy(tmp_path_factory.mktemp("hostile"))
    yield impl
    impl.store.close()


def test_the_body_the_ci_fuzz_run_crashed_the_proxy_with_is_a_400(proxy):
    sent = len(proxy.engine._target.bodies)
    assert _status(proxy, MESSAGES, CI_BODY) == 400
    hi = [{"role": "user", "content": "hi"}]
    for api, body in [(CHAT, {"messages": hi, "tools": 7}), (MESSAGES, {"messages": hi, "tools": {}}),
                      (RESPONSES, {"input": "hi", "tools": "x"}), (MESSAGES, {"messages": hi, "system": 7}),
                      (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": {}}]}]})]:
        assert _status(proxy, api, body) == 400, body
    assert len(proxy.engine._target.bodies) == sent  # refused before the engine


def test_a_model_that_is_not_a_string_is_a_400_before_the_engine(proxy):
    """The CI fuzz run of 2026-12-04: `"model": []` on /v1/messages reached the engine, whose adapter lookup
    hashed it (a 500). Both APIs define `model` as a string; clawray also takes it absent or null."""
    sent = len(proxy.engine._target.bodies)
    hi = [{"role": "user", "content": "hi"}]
    for model in ([], {}, 7, ["clawray-policy"], True):
        for api, body in [(CHAT, {"messages": hi}), (MESSAGES, {"messages": hi, "max_tokens": 4}),
                          (RESPONSES, {"input": "hi"})]:
            response = asyncio.run(proxy.handle(_request({**body, "model": model}), api))
            assert response.status_code == 400 and b"model" in response.body, (api.name, model)
    assert len(proxy.engine._target.bodies) == sent
    assert _status(proxy, CHAT, {"messages": hi, "model": None}) == 200


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=BODY, anthropic=st.booleans())
def test_any_chat_or_messages_body_is_served_or_refused_with_a_4xx(proxy, body, anthropic):
    status = _status(proxy, MESSAGES if anthropic else CHAT, body)
    assert status == 200 or 400 <= status < 500, body


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=RESPONSES_BODY)
def test_any_responses_body_is_served_or_refused_with_a_4xx(proxy, body):
    status = _status(proxy, RESPONSES, body)
    assert status == 200 or 400 <= status < 500, body
