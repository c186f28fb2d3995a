"""`clawray memory` sub-app on a real storage root: list, search, show, export, forget, stats; errors are
one line and exit 1. Also `memory.report.summary` (what the demo's report shows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory import cli as memory_cli
from memory.report import render_markdown, summary
from memory.sqlite_store import SqliteMemoryStore
from memory.store import Plan
from memory.units import Kind, Level, MemoryUnit
from tests.memory_fakes import WordEmbedder


@pytest.fixture
def env(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"storage_root: {tmp_path / 'state'}\nmemory: {{embedding_model: null}}\n")
    store = SqliteMemoryStore(tmp_path / "state" / "memory" / "memory.db")
    old = MemoryUnit(kind=Kind.semantic, content="The user's editor is vim.", key="editor", level=Level.user,
                     user="alice")
    new = MemoryUnit(kind=Kind.semantic, content="The user's editor is emacs.", key="editor", level=Level.user,
                     user="alice", supersedes=old.unit_id)
    plan = Plan(inserts=[(old, None), (new, None),
                         (MemoryUnit(kind=Kind.preference, content="The user prefers kiwi tea.", level=Level.workspace,
                                     user="alice", workspace="w"), None),
                         (MemoryUnit(kind=Kind.semantic, content="Bob's editor is nano.", level=Level.user,
                                     user="bob"), None)])
    store.apply(plan, [])
    store.apply(Plan(supersessions=[(old.unit_id, new.unit_id)]), [])
    store.close()
    runner = CliRunner()

    def run(*args: str, input: str | None = None):
        return runner.invoke(memory_cli.memory_app, ["--config", str(cfg), *args], input=input)

    return run, {"old": old.unit_id, "new": new.unit_id}, tmp_path


def test_list_show_search_export(env):
    run, ids, tmp = env
    r = run("list", "--user", "alice", "--json")
    assert r.exit_code == 0 and {u["content"] for u in json.loads(r.output)} == {
        "The user's editor is emacs.", "The user prefers kiwi tea."}
    r = run("list", "--all", "-n", "10")
    assert r.exit_code == 0 and "4 unit(s)" in r.output
    listed = json.loads(run("list", "--all", "--json").output)
    assert [u["superseded_by"] for u in listed if u["unit_id"] == ids["old"]] == [ids["new"]]
    r = run("show", ids["new"])
    shown = json.loads(r.output)
    assert [u["unit_id"] for u in shown["history"]] == [ids["old"], ids["new"]]
    r = run("search", "which editor", "--user", "alice", "--workspace", "w", "--json")
    assert r.exit_code == 0 and [u["content"] for u in json.loads(r.output)] == ["The user's editor is emacs."]
    out = tmp / "alice.jsonl"
    r = run("export", "--user", "alice", "--out", str(out))
    assert r.exit_code == 0 and len(out.read_text().splitlines()) == 3  # history included


def test_search_uses_the_embedder_the_mounting_cli_hands_in(env, monkeypatch):
    run, _, tmp = env
    (tmp / "c.yaml").write_text(f"storage_root: {tmp / 'state'}\nmemory: {{min_similarity: 0.0}}\n")
    emb = WordEmbedder()
    monkeypatch.setattr(memory_cli, "_embedder_factory", lambda model, encoder: emb)
    r = run("search", "which editor", "--user", "alice", "--workspace", "w")
    assert r.exit_code == 0 and emb.calls == [["which editor"]] and "full text only" not in r.output


def test_forget_a_user_asks_first_and_deletes_for_good(env):
    run, ids, _ = env
    assert run("forget", "--user", "alice", input="n\n").exit_code == 1
    r = run("forget", "--user", "alice", "--yes")
    assert r.exit_code == 0 and "3 unit(s) deleted" in r.output
    assert json.loads(run("list", "--user", "alice", "--all", "--json").output) == []
    assert json.loads(run("list", "--user", "bob", "--json").output)[0]["content"] == "Bob's editor is nano."


def test_forget_one_unit(env):
    run, ids, _ = env
    r = run("forget", "--unit", ids["old"], "--yes")
    assert r.exit_code == 0 and "1 unit(s) deleted" in r.output


@pytest.mark.parametrize("args, msg", [
    (("show", "nope"), "no memory unit 'nope'"),
    (("forget", "--unit", "nope", "--yes"), "no memory unit 'nope'"),
    (("forget", "--yes"), "name what to forget"),
    (("forget", "--user", "a", "--session", "s", "--yes"), "give the workspace"),
    (("list", "--kind", "gossip"), "kind must be one of"),
    (("list", "--workspace", "w"), "give the user"),
    (("search", "x", "--user", "alice"), "--workspace"),
    (("search", "x", "--user", "alice", "--workspace", "w", "--scope", "team"), "scope must be one of"),
])
def test_errors_are_one_line_without_traceback(env, args, msg):
    run, _, _ = env
    r = run(*args)
    assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output
    assert r.output.strip().count("\n") == 0


def test_stats_and_the_report_summary_show_what_was_remembered(env):
    run, _, tmp = env
    data = summary(tmp / "state")
    alice = data["users"]["alice"]
    assert (alice["units"], alice["superseded"], alice["by_kind"]) == (2, 1, {"semantic": 1, "preference": 1})
    assert {e["content"] for e in alice["examples"]} == {"The user's editor is emacs.", "The user prefers kiwi tea."}
    md = render_markdown(data)
    assert "### alice: 2 unit(s)" in md and "emacs" in md and "vim" not in md
    r = run("stats")
    assert r.exit_code == 0 and "### bob: 1 unit(s)" in r.output
    assert summary(tmp / "empty") == {"users": {}, "totals": {"units": 0}}
    assert "Nothing remembered yet" in render_markdown(summary(tmp / "empty"))
