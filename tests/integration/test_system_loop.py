"""The fast loop end to end on the running local cluster: proxy turns -> PRM -> Replay + Evolver ->
new skill -> generation bump -> the next request's system prompt contains it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import ray
from transformers import AutoTokenizer

from tests.integration.helpers import app_turns, wait_for

pytestmark = pytest.mark.slow

SPEC = {"type": "multi_choice", "options": {"A": "edit in place", "B": "backup first"}, "answer": ["B"]}
QUESTION = "Before changing config.json, what do you do first?\nA. edit it\nB. back it up\nAnswer with \\bbox{X}."
LESSON = "B is correct: you must create a .bak backup before modifying a file."


def _wait(pred, timeout=60.0, every=0.5):
    value = wait_for(pred, timeout, every)
    assert value, "condition not met in time"
    return value


def test_failed_session_evolves_a_skill_that_the_next_request_gets(openai_client, serve_app):
    h = serve_app["handles"]
    gen0 = ray.get(h["Evolver"].generation.remote())
    sid = f"fail-{uuid.uuid4().hex[:8]}"
    msgs = [{"role": "user", "content": QUESTION}]
    r = openai_client.chat.completions.create(
        model="clawray-policy", messages=msgs, max_tokens=8,
        extra_headers={"X-Session-Id": sid}, extra_body={"clawray_eval": SPEC})
    msgs += [{"role": "assistant", "content": r.choices[0].message.content or ""},
             {"role": "user", "content": f"[Previous Feedback] {LESSON}\n\nAnd the next file?"}]
    openai_client.chat.completions.create(
        model="clawray-policy", messages=msgs, max_tokens=8,
        extra_headers={"X-Session-Id": sid, "X-Session-Done": "true"}, extra_body={"clawray_eval": SPEC})

    # Both turns are scored by the PRM (checker: no box -> fail) and stored in Replay as support.
    gen1 = _wait(lambda: (g := ray.get(h["Evolver"].generation.remote())) > gen0 and g)
    skills_dir = Path(serve_app["config"].storage_path()) / "skills"
    names = [p.parent.name for p in skills_dir.glob("*/SKILL.md")]
    assert names, "the evolver wrote no SKILL.md"

    # The very next request (new session) is served with the new generation and its skill injected.
    sid2 = f"next-{uuid.uuid4().hex[:8]}"
    time.sleep(serve_app["config"].skills.refresh_s + 0.5)
    openai_client.chat.completions.create(
        model="clawray-policy", max_tokens=4, extra_headers={"X-Session-Id": sid2, "X-Session-Done": "1"},
        messages=[{"role": "system", "content": "You help with files."},
                  {"role": "user", "content": "Please modify config.json and create a backup .bak first"}])
    (turn,) = app_turns(serve_app, sid2)
    assert turn.skill_generation == gen1
    assert turn.skills, "no skill was injected"
    tok = AutoTokenizer.from_pretrained(serve_app["config"].model_path())
    prompt = tok.decode(turn.prompt_ids)
    assert "Active Skills" in prompt and turn.skills[0] in prompt


def test_captured_turns_become_scored_samples_in_replay(openai_client, serve_app):
    h = serve_app["handles"]
    sid = f"score-{uuid.uuid4().hex[:8]}"
    openai_client.chat.completions.create(
        model="clawray-policy", max_tokens=6, messages=[{"role": "user", "content": QUESTION}],
        extra_headers={"X-Session-Id": sid, "X-Session-Done": "true"}, extra_body={"clawray_eval": SPEC})
    (turn,) = app_turns(serve_app, sid)
    # sample_id == turn_id (re-delivery is idempotent); the checker failed it -> reward < 0.
    state = _wait(lambda: ray.get(h["Replay"].states.remote([turn.turn_id])).get(turn.turn_id))
    assert state in {"fresh", "support", "retired"}


def test_side_turns_never_become_samples(openai_client, serve_app):
    sid = f"side-{uuid.uuid4().hex[:8]}"
    openai_client.chat.completions.create(
        model="clawray-policy", max_tokens=4, messages=[{"role": "user", "content": "title for this chat"}],
        extra_headers={"X-Session-Id": sid, "X-Turn-Type": "side", "X-Session-Done": "1"})
    assert app_turns(serve_app, sid) == []
