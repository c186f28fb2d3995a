"""Programmatic checkers on good and bad inputs (tmp_path workspaces)."""

import json
import os

import pytest

from rewards.checkers import CHECKERS, CheckerSpecError, PathEscape, UnknownChecker, evaluate, get_checker
from rewards.checkers.bench import is_iso8601, json_path_values

MC = {"type": "multi_choice", "options": {k: k for k in "ABCDEF"}, "answer": ["A", "C"]}


def write(ws, rel, text):
    p = ws / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


# --- registry -------------------------------------------------------------------------------


def test_unknown_checker_lists_valid_names():
    with pytest.raises(UnknownChecker) as e:
        get_checker("nope")
    for name in CHECKERS:
        assert name in str(e.value)


def test_spec_without_type_is_refused():
    with pytest.raises(CheckerSpecError, match="type"):
        evaluate({"options": {}}, "", None)


def test_checker_not_enabled_is_refused():
    with pytest.raises(UnknownChecker, match="not enabled"):
        evaluate(MC, "\\bbox{A,C}", None, allowed=["iso8601"])


# --- multi_choice ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, score, passed",
    [
        ("The answer: \\bbox{A,C}", 1.0, True),
        ("\\boxed{C, A}", 1.0, True),
        ("\\boxed{AC}", 1.0, True),
        ("\\bbox{a c}", 1.0, True),
        ("\\bbox{A}", 1 - 1 / 6, False),  # one false negative
        ("\\bbox{A,C,E}", 1 - 1 / 6, False),  # one false positive
        ("\\bbox{B,D}", 1 - 4 / 6, False),
        ("\\bbox{B} then corrected \\bbox{A,C}", 1.0, True),  # last box wins
        ("A and C", 0.0, False),  # no box
        ("\\bbox{B,D,E,F,X}", 0.0, False),  # fp=5, fn=2: floored at 0
    ],
)
def test_multi_choice_scores(reply, score, passed):
    r = evaluate(MC, reply, None)
    assert r.score == pytest.approx(score)
    assert r.passed is passed
    assert r.checker == "multi_choice"


def test_multi_choice_bad_spec():
    with pytest.raises(CheckerSpecError):
        evaluate({"type": "multi_choice", "options": {"A": 1}, "answer": ["Z"]}, "\\bbox{A}", None)


# --- iso8601 --------------------------------------------------------------------------------


def test_iso8601_helpers():
    assert is_iso8601("2026-03-16T09:30:00+08:00")
    assert is_iso8601("2026-03-16T09:30:00.123+08:00")
    assert not is_iso8601("2026-03-16 09:30:00")
    assert not is_iso8601("2026-03-16T09:30:00Z")
    assert not is_iso8601("2026-13-16T09:30:00+08:00")  # month 13
    assert is_iso8601("2026-03-16T09:30:00Z", offset="Z")
    assert is_iso8601("2026-03-16T09:30:00-05:00", offset="any")
    assert json_path_values({"a": [{"b": 1}, {"b": 2}]}, "a[].b") == [1, 2]


def test_iso8601_good_and_bad(tmp_path):
    doc = {"meeting_time": "2026-03-16T09:30:00+08:00",
           "action_items": [{"due_date": "2026-03-17T18:00:00+08:00"}, {"due_date": "2026-03-18T12:00:00.5+08:00"}]}
    write(tmp_path, "day01/standup.json", json.dumps(doc))
    spec = {"type": "iso8601", "file": "day01/standup.json", "paths": ["meeting_time", "action_items[].due_date"]}
    assert evaluate(spec, "", tmp_path).passed
    doc["action_items"][1]["due_date"] = "2026-03-18 12:00"
    write(tmp_path, "day01/standup.json", json.dumps(doc))
    r = evaluate(spec, "", tmp_path)
    assert not r.passed and "action_items[].due_date" in r.reason
    assert not evaluate({**spec, "paths": ["missing_key"]}, "", tmp_path).passed
    assert not evaluate({**spec, "file": "day01/none.json"}, "", tmp_path).passed
    write(tmp_path, "bad.json", "{not json")
    assert not evaluate({**spec, "file": "bad.json"}, "", tmp_path).passed


def test_iso8601_offset_configurable(tmp_path):
    write(tmp_path, "a.json", json.dumps({"t": "2026-03-16T09:30:00Z"}))
    spec = {"type": "iso8601", "file": "a.json", "paths": ["t"]}
    assert not evaluate(spec, "", tmp_path).passed
    assert evaluate({**spec, "offset": "Z"}, "", tmp_path).passed


# --- filename -------------------------------------------------------------------------------


@pytest.mark.parametrize("name, ok", [("20260316_sprint_review.md", True), ("day03/20260316_a1_b.json", True),
                                      ("sprint_review.md", False), ("20260316_SprintReview.md", False),
                                      ("2026-03-16_review.md", False), ("20260316_review", False)])
def test_filename_single(name, ok):
    assert evaluate({"type": "filename", "name": name}, "", None).passed is ok


def test_filename_dir_min_count(tmp_path):
    write(tmp_path, "day03/README.md", "inputs may have any name")
    write(tmp_path, "day03/20260316_ci_report.json", "{}")
    spec = {"type": "filename", "dir": "day03", "ext": "json"}
    assert evaluate(spec, "", tmp_path).passed
    r = evaluate({**spec, "min_count": 2}, "", tmp_path)
    assert not r.passed and "need 2" in r.reason
    write(tmp_path, "day03/20260316_test_results.json", "{}")
    assert evaluate({**spec, "min_count": 2}, "", tmp_path).passed
    assert not evaluate({**spec, "ext": "md"}, "", tmp_path).passed  # README.md only


# --- metadata -------------------------------------------------------------------------------

GOOD_META = {"created_at": "2026-03-30T10:00:00+08:00", "author": "metaclaw_agent", "status": "done"}


def test_metadata_json_markdown_python_csv(tmp_path):
    write(tmp_path, "a.json", json.dumps({"meta": GOOD_META, "data": []}))
    write(tmp_path, "b.md", "---\ncreated_at: '2026-03-30T10:00:00+08:00'\nauthor: me\nstatus: pending\n---\n# T\n")
    write(tmp_path, "c.py", '"""Parser.\n\nMeta:\n  created_at: 2026-04-01T09:00:00+08:00\n'
                            '  author: metaclaw_agent\n  status: done\n"""\nX = 1\n')
    write(tmp_path, "d.csv", "# meta: created_at=2026-04-03T09:00:00+08:00 author=bot status=in_progress\na,b\n")
    for f in ("a.json", "b.md", "c.py", "d.csv"):
        r = evaluate({"type": "metadata", "file": f}, "", tmp_path)
        assert r.passed, (f, r.reason)


@pytest.mark.parametrize("meta, problem", [
    ({**GOOD_META, "status": "finished"}, "status"),
    ({**GOOD_META, "author": ""}, "author"),
    ({**GOOD_META, "created_at": "2026-03-30"}, "created_at"),
    ({k: v for k, v in GOOD_META.items() if k != "author"}, "author"),
])
def test_metadata_bad_fields(tmp_path, meta, problem):
    write(tmp_path, "a.json", json.dumps({"meta": meta}))
    r = evaluate({"type": "metadata", "file": "a.json"}, "", tmp_path)
    assert not r.passed and problem in r.reason


def test_metadata_missing_block(tmp_path):
    write(tmp_path, "a.md", "# no front matter\n")
    write(tmp_path, "b.json", json.dumps({"created_at": "2026-03-30T10:00:00+08:00"}))  # not under meta
    assert not evaluate({"type": "metadata", "file": "a.md"}, "", tmp_path).passed
    assert not evaluate({"type": "metadata", "file": "b.json"}, "", tmp_path).passed


# --- backup ---------------------------------------------------------------------------------


def test_backup_good_and_bad(tmp_path):
    spec = {"type": "backup", "file": "day08/prod_config.py"}
    write(tmp_path, "day08/prod_config.py", "API_TIMEOUT = 60\n")
    assert "not found" in evaluate(spec, "", tmp_path).reason
    write(tmp_path, "day08/prod_config.py.bak", "API_TIMEOUT = 60\n")
    assert "identical" in evaluate(spec, "", tmp_path).reason
    write(tmp_path, "day08/prod_config.py.bak", "API_TIMEOUT = 30\n")
    assert evaluate(spec, "", tmp_path).passed


# --- done_log -------------------------------------------------------------------------------

LINE = "[DONE] 2026-04-13T10:00:00+08:00 | {id} | {summary}"


def test_done_log_good_and_bad(tmp_path):
    spec = {"type": "done_log", "log": "done.log", "min_entries": 2, "task_prefix": "api_"}
    write(tmp_path, "done.log", LINE.format(id="spec_draft", summary="wrote the spec") + "\n"
          + LINE.format(id="api_client", summary="client done") + "\n\n")
    assert evaluate(spec, "", tmp_path).passed
    assert not evaluate({**spec, "min_entries": 3}, "", tmp_path).passed
    assert "does not start with" in evaluate({**spec, "task_prefix": "q1"}, "", tmp_path).reason
    (tmp_path / "empty").mkdir()
    assert "not found" in evaluate({"type": "done_log"}, "", tmp_path / "empty").reason


@pytest.mark.parametrize("line", [
    "DONE 2026-04-13T10:00:00+08:00 | a | b",
    "[DONE] 2026-04-13 10:00 | a | b",
    "[DONE] 2026-04-13T10:00:00+08:00 | a b | c",
    "[DONE] 2026-04-13T10:00:00+08:00 | a | " + "x" * 81,
    "[DONE] 2026-04-13T10:00:00+08:00 | a",
])
def test_done_log_bad_lines(tmp_path, line):
    write(tmp_path, "done.log", line + "\n")
    assert not evaluate({"type": "done_log"}, "", tmp_path).passed


# --- paths ----------------------------------------------------------------------------------


def test_file_args_cannot_escape_workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    write(tmp_path, "secret.json", json.dumps({"t": "2026-03-16T09:30:00+08:00"}))
    spec = {"type": "iso8601", "file": "../secret.json", "paths": ["t"]}
    r = evaluate(spec, "", ws)
    assert not r.passed and "outside" in r.reason
    os.symlink(tmp_path / "secret.json", ws / "link.json")  # a symlink the model made
    assert "outside" in evaluate({**spec, "file": "link.json"}, "", ws).reason


def test_spec_workspace_subdir_must_stay_inside(tmp_path):
    (tmp_path / "root" / "day01").mkdir(parents=True)
    write(tmp_path, "root/day01/done.log", LINE.format(id="a", summary="b") + "\n")
    assert evaluate({"type": "done_log", "workspace": "day01"}, "", tmp_path / "root").passed
    with pytest.raises(PathEscape):
        evaluate({"type": "done_log", "workspace": "../"}, "", tmp_path / "root")


def test_workspace_checkers_need_a_workspace():
    with pytest.raises(CheckerSpecError, match="workspace"):
        evaluate({"type": "backup", "file": "a"}, "", None)


def test_lowercase_gives_partial_credit():
    from rewards.checkers import evaluate

    assert evaluate({"type": "lowercase"}, "all good here", None).score == 1.0
    half = evaluate({"type": "lowercase"}, "abCD", None)
    assert half.score == 0.5 and not half.passed
    assert evaluate({"type": "lowercase"}, "1234 !!", None).score == 0.0
    import pytest

    from rewards.checkers import CheckerSpecError

    with pytest.raises(CheckerSpecError):
        evaluate({"type": "lowercase", "threshold": 3}, "x", None)


def test_uppercase_mirrors_lowercase():
    from rewards.checkers import CheckerSpecError, evaluate

    assert evaluate({"type": "uppercase"}, "SHIP THE ETA EXPORT", None).score == 1.0
    half = evaluate({"type": "uppercase"}, "abCD", None)
    assert half.score == 0.5 and not half.passed and half.checker == "uppercase"
    assert evaluate({"type": "uppercase", "threshold": 0.5}, "abCD", None).passed
    assert evaluate({"type": "uppercase"}, "42", None).score == 0.0
    with pytest.raises(CheckerSpecError, match="uppercase: threshold"):
        evaluate({"type": "uppercase", "threshold": 0}, "X", None)
