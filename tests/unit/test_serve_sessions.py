import json
import multiprocessing as mp
import os
import signal

from core.contracts import Turn
from serve.history import read_history
from serve.sessions import SessionStore
from serve.turns import RequestError, derive_session_id, extract_meta


def _turn(sid, **kw):
    return Turn(session_id=sid, turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0], **kw)


def test_next_turn_completes_previous(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    first = [{"role": "user", "content": "q"}]
    (a,) = s.record([_turn("s1", response_text="answer")], read_history(first))
    assert a.turn_index == 0 and s.claim(10, 60) == []  # pending until its next state arrives
    nxt = [{"role": "user", "content": "feedback"}]
    (b,) = s.record([_turn("s1")], read_history(first + [{"role": "assistant", "content": "answer"}, *nxt]))
    assert b.turn_index == 1
    (done,) = s.claim(10, 60)
    assert done.turn_id == a.turn_id and done.next_state == nxt
    s.mark_dispatched([done.turn_id])
    assert s.end_session("s1") == 1
    (last,) = s.claim(10, 60)
    assert last.turn_id == b.turn_id and last.last_in_session


def test_claim_lease_redelivers_after_release(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    s.record([_turn("s", last_in_session=True)], None)
    (t,) = s.claim(10, 60)
    assert s.claim(10, 60) == []  # leased
    s.release([t.turn_id], retry_in_s=0)
    assert [x.turn_id for x in s.claim(10, 60)] == [t.turn_id]


def test_idle_sessions_are_flushed(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    s.record([_turn("s")], None)
    assert s.flush_idle(idle_s=0) == 1
    (t,) = s.claim(1, 60)
    assert t.last_in_session and t.next_state is None


def _writer(path, n, ready, state):
    s = SessionStore(path, state)
    for i in range(n):
        s.record([_turn(f"k{i}", last_in_session=True)], None)
        ready.value = i + 1
    os.kill(os.getpid(), signal.SIGSTOP)


def test_acknowledged_turns_survive_kill(tmp_path, state_cfg):
    path = tmp_path / "s.db"
    ready = mp.Value("i", 0)
    p = mp.get_context("fork").Process(target=_writer, args=(path, 20, ready, state_cfg))
    p.start()
    while ready.value < 20 and p.is_alive():
        pass
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert len(SessionStore(path, state_cfg).claim(100, 60)) == 20


def test_meta_headers_win_and_fields_are_stripped():
    body = {"messages": [{"role": "user", "content": "hi"}], "session_id": "body-s", "turn_type": "side",
            "clawray_eval": {"type": "multi_choice"}}
    meta = extract_meta(body, {"x-session-id": "hdr-s", "x-user-id": "u1"}, "client")
    assert meta.session_id == "hdr-s" and meta.turn_type.value == "side" and meta.tenant == "u1/default"
    assert meta.eval_spec == {"type": "multi_choice"}
    assert "session_id" not in body and "clawray_eval" not in body


def test_bad_turn_type_refused():
    import pytest

    with pytest.raises(RequestError):
        extract_meta({"messages": []}, {"x-turn-type": "bogus"}, "c")


def test_ids_that_could_not_travel_back_in_a_header_are_refused():
    """Found by the fuzzer: a body `session_id` outside latin-1 made the X-Session-Id reply header fail (500)."""
    import pytest

    for field, value in (("session_id", "s-\uc6e5"), ("user_id", "jos\u00e9"), ("workspace_id", "w\x00"),
                         ("session_id", "x" * 300)):
        body = {"messages": [], field: value}
        with pytest.raises(RequestError, match="printable ASCII"):
            extract_meta(body, {}, "c")
    assert extract_meta({"messages": [], "session_id": "ok-123_A.b:c"}, {}, "c").session_id == "ok-123_A.b:c"


def test_derived_ids_do_not_merge_clients_or_conversations():
    m1 = [{"role": "user", "content": "plan my day"}]
    m2 = [{"role": "user", "content": "write a poem"}]
    follow = m1 + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    a = derive_session_id("t", "client-a", m1)
    assert a == derive_session_id("t", "client-a", follow)  # same conversation continues
    assert a != derive_session_id("t", "client-b", m1)  # another client
    assert a != derive_session_id("t", "client-a", m2)  # another conversation


def test_history_keys_an_exchange_by_what_it_answered_and_its_reply():
    msgs = [{"role": "system", "content": "skills here"}, {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}, {"role": "user", "content": "f"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "1", "function": {"name": "ls", "arguments": '{"b": 1, "a": 2}'}}]}]
    turn_q = read_history(msgs[:2])
    h = read_history(msgs)
    assert h.continuations == {turn_q.turn_key("a", []): msgs[3:5]}  # the last assistant: nothing followed
    assert turn_q.turn_key(" a\n", []) == turn_q.turn_key("a", [])  # whitespace never matters
    assert turn_q.turn_key("b", []) not in h.continuations  # another reply to the same question
    after_f = read_history(msgs[:5])
    # a reply that made tool calls is its calls (name + canonical arguments), whatever text came with them
    call = {"id": "x", "function": {"name": "ls", "arguments": '{"a":2,"b":1}'}}
    follow = read_history(msgs + [{"role": "tool", "content": "files"}])
    assert follow.continuations[after_f.turn_key("<tool_call>...</tool_call>", [call])] == [
        {"role": "tool", "content": "files"}]
    retry = read_history([{"role": "system", "content": "other skills"}, *msgs[1:]])
    assert retry.request_key == h.request_key  # the system message (skill injection) is not the conversation
    assert read_history(msgs[:4]).request_key != h.request_key


def test_history_never_raises_on_odd_messages():
    odd = [{"role": "assistant", "content": 3, "tool_calls": "nope"}, {"role": "user", "content": [1, {"x": 2}]},
           {"role": "assistant", "tool_calls": [{"function": "ls"}, 7]}, {"role": None}]
    h = read_history(odd)
    assert len(h.continuations) == 2 and h.request_key


def test_claim_leases_a_whole_batch_in_order(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    ids = [s.record([_turn(f"b{i}", last_in_session=True)], None)[0].turn_id for i in range(5)]
    first = s.claim(3, 60)
    assert [t.turn_id for t in first] == ids[:3]
    assert [t.turn_id for t in s.claim(10, 60)] == ids[3:]  # the first three are leased
    assert s.claim(10, 60) == []


def test_dispatched_turns_are_pruned_after_retention_and_pending_ones_never(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    s.record([_turn("old", last_in_session=True)], None)
    s.record([_turn("open")], None)  # pending: waits for its next state, must survive any pruning
    (t,) = s.claim(10, 60)
    s.mark_dispatched([t.turn_id])
    assert s.prune(older_than_s=3600) == 0  # dispatched just now: kept for inspection
    assert s.prune(older_than_s=0) == 1
    assert [x.session_id for x in s.turns()] == ["open"]
    assert s.stats()["sessions"] == 1  # the ended session's row went with its turns


def test_a_file_from_before_the_next_state_columns_still_reads_and_completes(tmp_path):
    """Older stores kept the next state inside the payload: they are migrated in place, rows intact."""
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE sessions (session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0,
          last_seen REAL NOT NULL, done INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE turns (turn_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, turn_index INTEGER NOT NULL,
          state TEXT NOT NULL, payload TEXT NOT NULL, updated_at REAL NOT NULL,
          claimed_until REAL NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0);""")
    done = _turn("s", next_state=[{"role": "user", "content": "old feedback"}])
    pending = _turn("s2")
    db.executemany("INSERT INTO turns(turn_id, session_id, turn_index, state, payload, updated_at) VALUES(?,?,0,?,?,0)",
                   [(done.turn_id, "s", "completed", done.model_dump_json()),
                    (pending.turn_id, "s2", "pending", pending.model_dump_json())])
    db.execute("INSERT INTO sessions VALUES('s2', 'default', 1, 0, 0)")
    db.commit()
    db.close()
    s = SessionStore(path)
    (old,) = s.claim(10, 60)
    assert old.turn_id == done.turn_id and old.next_state == [{"role": "user", "content": "old feedback"}]
    # A pending row from before the exchange keys matches no request: it waits for the idle flush.
    s.record([_turn("s2")], read_history([{"role": "user", "content": "new"}]))
    assert s.flush_idle(idle_s=0) == 2
    flushed = [t for t in s.turns(state="completed") if t.turn_id == pending.turn_id]
    assert flushed[0].idle_flushed and flushed[0].next_state is None


async def test_an_idle_flush_is_not_a_session_end_for_evolution(tmp_path, state_cfg):
    """Issue 12 item 9: the idle timeout completes a quiet conversation's turn (`last_in_session`, for
    scoring) but is kept apart from an ended session (`idle_flushed`): the Evolver's `session_end`
    trigger fires only for the latter."""
    from core.config import EvolverConfig, SkillsConfig
    from core.contracts import Sample
    from evolve.bank import SkillBank
    from evolve.evolvers import FeedbackEvolver
    from evolve.loop import EvolutionLoop

    s = SessionStore(tmp_path / "s.db", state_cfg)
    feedback = [{"role": "user", "content": "[Previous Feedback] You must create config.json.bak first."}]
    for sid in ("quiet", "ended"):
        s.record([_turn(sid, messages=[{"role": "user", "content": "edit config.json"}], next_state=feedback)])
    assert s.flush_idle(idle_s=0) == 2  # the "ended" one is ended explicitly below
    s.record([_turn("ended2", messages=[{"role": "user", "content": "edit config.json"}], next_state=feedback)])
    assert s.end_session("ended2") == 1
    quiet = next(t for t in s.turns("quiet"))
    ended = next(t for t in s.turns("ended2"))
    assert quiet.last_in_session and quiet.idle_flushed  # scoring still sees the last turn it will get
    assert ended.last_in_session and not ended.idle_flushed

    only_session_end = EvolverConfig(failure_rate_threshold=1.0)  # no other trigger can fire
    loop = EvolutionLoop(SkillBank(tmp_path / "skills", SkillsConfig()), only_session_end, FeedbackEvolver())
    assert await loop.observe(quiet, Sample.from_turn(quiet, reward=-1.0, trainable=True)) is None
    assert loop.pending() == {"quiet": 1}  # kept: the conversation may resume
    report = await loop.observe(ended, Sample.from_turn(ended, reward=-1.0, trainable=True))
    assert report is not None and report.trigger == "session_end"


# Claude Code 2.1's requests, as a live run recorded them (tests/integration/test_agents_live.py): the
# conversation, then a system message of its own after it whose text changes from request to request.
def _claude_code(reminder: str, sid: str = "5e9f0864-c9a6-4fb3-b9ee-90e593c422d6") -> tuple[dict, dict]:
    body = {"system": [{"type": "text", "text": "You are a Claude agent."}],
            "metadata": {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": sid})},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Reply with the word ok."}]},
                         {"role": "system", "content": [{"type": "text", "text": f"# Environment {reminder}"}]}]}
    return body, {"x-claude-code-session-id": sid, "user-agent": "claude-cli/2.1.332"}


def test_a_system_message_after_the_conversation_starts_does_not_split_its_derived_session():
    first = [{"role": "user", "content": "plan"}, {"role": "system", "content": "now 10:00"}]
    later = [{"role": "user", "content": "plan"}, {"role": "assistant", "content": "ok"},
             {"role": "system", "content": "now 10:05"}, {"role": "user", "content": "more"}]
    assert derive_session_id("t", "c", first) == derive_session_id("t", "c", later)
    leading = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "plan"}]
    assert derive_session_id("t", "c", leading) != derive_session_id("t", "c", first)  # the leading prompt counts


def test_an_agents_own_session_id_keeps_its_requests_in_one_session_and_never_merges_clients():
    a1, h1 = _claude_code("one")
    a2, h2 = _claude_code("two, longer")
    s1 = extract_meta(a1, h1, "client-a").session_id
    assert s1 == extract_meta(a2, h2, "client-a").session_id and s1.startswith("derived-")
    other, ho = _claude_code("one", sid="0b5e8a0e-0000-4000-8000-000000000000")
    assert extract_meta(other, ho, "client-a").session_id != s1  # another Claude Code session
    b, hb = _claude_code("one")
    assert extract_meta(b, hb, "client-b").session_id != s1  # another client with the same id: never merged
    c, hc = _claude_code("one")
    assert extract_meta(c, {**hc, "x-session-id": "mine"}, "client-a").session_id == "mine"  # clawray's wins
    d, _ = _claude_code("one")  # the id in the body's metadata alone (no header) serves as well
    assert extract_meta(d, {}, "client-a").session_id == s1


# ---- the skills block is stored once, and every reader gets the messages whole ---------------------------

BLOCK = "## Active Skills\n\nApply the skills below.\n\n### plan-first\n_Plan first._\n\n" + "Keep the times. " * 200
SHAPES = {  # the three ways serve/injection.py add_to_system puts a block into messages
    "string": [{"role": "system", "content": f"You are brief.\n\n{BLOCK}\n\n## Memory\nlikes tea"},
               {"role": "user", "content": "plan"}],
    "parts": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": BLOCK}]},
              {"role": "user", "content": "plan"}],
    "alone": [{"role": "system", "content": BLOCK}, {"role": "user", "content": "plan"}],
}


def test_the_skills_block_is_stored_once_and_read_back_byte_for_byte(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    for i, msgs in enumerate(SHAPES.values()):
        s.record([_turn(f"b{i}", messages=msgs, skills=["plan-first"], last_in_session=True)], None, BLOCK)
    s.record([_turn("b-none", messages=SHAPES["alone"], last_in_session=True)], None, "")  # no block given
    with s._tx() as db:
        blocks = db.execute("SELECT COUNT(*) FROM blocks").fetchone()[0]
        payloads = [r[0] for r in db.execute("SELECT p.payload FROM payloads p JOIN turns t ON t.turn_id = p.turn_id "
                                             "WHERE t.session_id LIKE 'b_'")]
        inline = [r[0] for r in db.execute("SELECT payload FROM turns")]
    assert blocks == 1 and len(payloads) == 3 and not any("Keep the times." in p for p in payloads)  # one copy
    assert inline == [""] * 4  # the JSON is written once, in `payloads`: state updates do not rewrite it
    read = {t.session_id: t.messages for t in s.turns()}
    claimed = {t.session_id: t.messages for t in s.claim(10, 60)}
    for i, msgs in enumerate(SHAPES.values()):
        assert read[f"b{i}"] == msgs and claimed[f"b{i}"] == msgs
        assert json.dumps(read[f"b{i}"]) == json.dumps(msgs)  # same text, same key order
    assert read["b-none"] == SHAPES["alone"]


def test_a_block_that_is_not_in_the_messages_is_not_cut(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    msgs = [{"role": "user", "content": BLOCK}]  # the same text, but a user's: never where skills go
    s.record([_turn("u", messages=msgs, last_in_session=True)], None, BLOCK)
    (t,) = s.turns("u")
    assert t.messages == msgs
    with s._tx() as db:
        assert db.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 0


def test_pruning_keeps_blocks_that_stored_turns_still_need(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    other = BLOCK.replace("plan-first", "check-twice")
    s.record([_turn("old", messages=SHAPES["alone"], last_in_session=True)], None, BLOCK)
    s.record([_turn("kept", messages=[{"role": "system", "content": other}], last_in_session=True)], None, other)
    (old,) = s.claim(1, 60)
    s.mark_dispatched([old.turn_id])
    assert s.prune(older_than_s=-1) == 1  # the dispatched turn goes, and the block only it used
    with s._tx() as db:
        assert db.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 1
    (kept,) = s.turns("kept")
    assert kept.messages == [{"role": "system", "content": other}]
