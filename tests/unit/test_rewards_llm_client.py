"""core.llm.LLMClient against a scripted OpenAI-compatible server: retries, errors, limits, usage."""

import asyncio
import pickle

import pytest

from core.config import LLMEndpoint
from core.llm import LLMClient, LLMError, _strip_userinfo
from tests.fake_judge import FakeJudge, Script, free_port

KEY = "sk-test-very-secret-key"


@pytest.fixture
def judge():
    with FakeJudge(Script(replies=["Score: 1", "Score: -1"])) as j:
        yield j


def endpoint(url, monkeypatch=None, **kw):
    if monkeypatch is not None:
        monkeypatch.setenv("JUDGE_KEY_FOR_TEST", KEY)
    return LLMEndpoint(base_url=url, model="judge", api_key_env="JUDGE_KEY_FOR_TEST" if monkeypatch else None,
                       **{"timeout_s": 5, "max_retries": 2, "backoff_s": 0.01, **kw})


async def test_chat_returns_texts_and_counts_usage(judge, monkeypatch):
    client = LLMClient(endpoint(judge.base_url, monkeypatch))
    assert await client.chat([{"role": "user", "content": "hi"}], n=2) == ["Score: 1", "Score: -1"]
    assert judge.script.requests[0]["auth"] == f"Bearer {KEY}"
    assert judge.script.requests[0]["body"]["max_completion_tokens"] == 512
    u = client.usage.as_dict()
    assert (u["calls"], u["prompt_tokens"], u["completion_tokens"], u["failures"]) == (1, 10, 5, 0)


async def test_transient_5xx_is_retried(judge):
    judge.script.fail_next = 2
    client = LLMClient(endpoint(judge.base_url))
    assert await client.chat([{"role": "user", "content": "hi"}]) == ["Score: 1"]
    assert client.usage.retries == 2 and client.usage.failures == 0


async def test_persistent_5xx_raises_retryable_error_without_the_key(judge, monkeypatch):
    judge.script.fail_status = 500
    client = LLMClient(endpoint(judge.base_url, monkeypatch))
    with pytest.raises(LLMError) as e:
        await client.chat([{"role": "user", "content": "hi"}])
    err = e.value
    assert err.retryable and err.status == 500
    assert "3 attempt(s)" in str(err) and "judge at http://127.0.0.1" in str(err)
    assert KEY not in str(err) and "***" in str(err)  # the server echoed the key; we redacted it
    assert err.__cause__ is None and err.__context__ is None  # the SDK error (with headers) is dropped
    assert len(judge.script.requests) == 3 and client.usage.failures == 1
    again = pickle.loads(pickle.dumps(err))  # crosses Ray process boundaries intact
    assert again.retryable and again.status == 500 and str(again) == str(err)


async def test_4xx_is_not_retried(judge):
    judge.script.fail_status = 400
    client = LLMClient(endpoint(judge.base_url))
    with pytest.raises(LLMError) as e:
        await client.chat([{"role": "user", "content": "hi"}])
    assert not e.value.retryable and e.value.status == 400
    assert len(judge.script.requests) == 1


async def test_connection_refused_and_timeout_are_retryable():
    client = LLMClient(endpoint(f"http://127.0.0.1:{free_port()}/v1", max_retries=1))
    with pytest.raises(LLMError, match="connection failed") as e:
        await client.chat([{"role": "user", "content": "hi"}])
    assert e.value.retryable and client.usage.retries == 1
    with FakeJudge(Script(delay_s=1.0)) as slow:
        client = LLMClient(endpoint(slow.base_url, timeout_s=0.2, max_retries=0))
        with pytest.raises(LLMError, match="timed out"):
            await client.chat([{"role": "user", "content": "hi"}])


async def test_concurrency_limit(judge):
    judge.script.delay_s = 0.2
    client = LLMClient(endpoint(judge.base_url, max_concurrency=2))
    await asyncio.gather(*[client.chat([{"role": "user", "content": str(i)}]) for i in range(6)])
    assert judge.script.peak_inflight == 2


async def test_completion_logprobs_slices_the_response_span(judge):
    judge.script.logprob = lambda i, tok: -float(i)
    client = LLMClient(endpoint(judge.base_url))
    lps = await client.completion_logprobs([11, 12, 13], [21, 22])
    assert lps == [-3.0, -4.0]  # positions 3 and 4 of the echoed prompt+response
    body = judge.script.requests[-1]["body"]
    assert body["prompt"] == [11, 12, 13, 21, 22] and body["echo"] is True and body["max_tokens"] == 0


async def test_completion_logprobs_falls_back_to_max_tokens_1(judge):
    judge.script.reject_max_tokens_zero = True
    judge.script.logprob = lambda i, tok: -float(i)
    client = LLMClient(endpoint(judge.base_url))
    assert await client.completion_logprobs([1, 2], [3]) == [-2.0]
    assert await client.completion_logprobs([1], [2, 3]) == [-1.0, -2.0]
    assert [r["body"]["max_tokens"] for r in judge.script.requests] == [0, 1, 1]


async def test_tokenize_route(judge):
    client = LLMClient(endpoint(judge.base_url))
    with pytest.raises(LLMError) as e:
        await client.tokenize("hi there")
    assert e.value.status == 404 and not e.value.retryable
    judge.script.tokenize = lambda text: [len(w) for w in text.split()]
    assert await client.tokenize("hi there") == [2, 5]
    assert judge.script.requests[-1]["path"] == "/tokenize"


def test_userinfo_is_stripped_from_urls():
    assert _strip_userinfo("https://user:pw@api.example.com/v1") == "https://api.example.com/v1"
    assert _strip_userinfo("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
