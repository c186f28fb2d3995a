"""Command checks: argv only, no shell interpolation, workspace confinement, bench command strings."""

import os
import subprocess
import time

import pytest

from rewards.checkers import CheckerSpecError, PathEscape, evaluate
from rewards.checkers.shellparse import parse_command

PY = "python"


def cmd(argv, **kw):
    return {"type": "command", "argv": argv, **kw}


# --- command (argv) -------------------------------------------------------------------------


def test_command_exit_and_stdout(tmp_path):
    (tmp_path / "out.txt").write_text("hello world\n")
    assert evaluate(cmd(["cat", "out.txt"], expect_stdout="hello"), "", tmp_path).passed
    assert evaluate(cmd(["cat", "out.txt"], expect_stdout_regex=r"^hello\s+w"), "", tmp_path).passed
    r = evaluate(cmd(["cat", "out.txt"], expect_stdout="bye"), "", tmp_path)
    assert not r.passed and "stdout lacks" in r.reason
    assert evaluate(cmd([PY, "-c", "raise SystemExit(3)"], expect_exit=3), "", tmp_path).passed
    assert not evaluate(cmd([PY, "-c", "raise SystemExit(3)"]), "", tmp_path).passed


def test_command_missing_program_fails_cleanly(tmp_path):
    r = evaluate(cmd(["no-such-program-xyz"]), "", tmp_path)
    assert not r.passed and "127" in r.reason


def test_command_timeout_kills_the_process_group(tmp_path):
    marker = tmp_path / "late"
    code = "import subprocess,sys; subprocess.Popen([sys.executable,'-c','import time;time.sleep(1.5);open(\"late\",\"w\")']); time=__import__('time'); time.sleep(30)"
    t0 = time.monotonic()
    r = evaluate(cmd([PY, "-c", code], timeout=0.5), "", tmp_path)
    assert not r.passed and "timed out" in r.reason
    assert time.monotonic() - t0 < 5
    time.sleep(2)
    assert not marker.exists()  # the grandchild was killed with its group


def test_command_refuses_a_shell_string(tmp_path):
    with pytest.raises(CheckerSpecError, match="not a shell string"):
        evaluate(cmd("echo hi; rm -rf /"), "", tmp_path)


def test_argv_is_never_shell_interpreted(tmp_path):
    r = evaluate(cmd(["echo", "$(touch pwned)", ";", "touch", "pwned2", "`touch pwned3`"]), "", tmp_path)
    assert r.passed
    assert list(tmp_path.iterdir()) == []


def test_model_reply_only_reaches_stdin(tmp_path):
    reply = "$(touch pwned); touch pwned2 && `touch pwned3`"
    spec = cmd([PY, "-c", "import sys; print(sys.stdin.read())"], stdin_reply=True, expect_stdout=reply)
    assert evaluate(spec, reply, tmp_path).passed
    assert list(tmp_path.iterdir()) == []


def test_commands_do_not_see_the_scorer_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CLAWRAY_TEST_API_KEY", "sk-secret-123")
    spec = cmd([PY, "-c", "import os; print(sorted(os.environ))"], expect_stdout="CLAWRAY_TEST_API_KEY")
    assert not evaluate(spec, "", tmp_path).passed


def test_command_workspace_traversal_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    for bad in ("..", "../..", "/etc", "a/../../"):
        with pytest.raises(PathEscape):
            evaluate(cmd(["true"], workspace=bad), "", root)


def test_command_workspace_symlink_escape_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "link")
    with pytest.raises(PathEscape):
        evaluate(cmd(["true"], workspace="link"), "", root)
    (root / "inner").mkdir()
    os.symlink(root / "inner", root / "ok-link")  # a symlink that stays inside is fine
    assert evaluate(cmd(["true"], workspace="ok-link"), "", root).passed


# --- file_check (bench command strings) -----------------------------------------------------


def test_file_check_dispatches_bench_scripts_without_the_files(tmp_path):
    (tmp_path / "day07").mkdir()
    (tmp_path / "day07" / "api_docs.md").write_text("v2")
    spec = {"type": "file_check", "command": "python scripts/check_backup.py day07/api_docs.md", "expect_exit": 0}
    r = evaluate(spec, "", tmp_path)
    assert not r.passed and ".bak not found" in r.reason
    (tmp_path / "day07" / "api_docs.md.bak").write_text("v1")
    assert evaluate(spec, "", tmp_path).passed


def test_file_check_chain_and_substitution(tmp_path):
    (tmp_path / "day05").mkdir()
    (tmp_path / "day05" / "20260330_plan.md").write_text(
        "---\ncreated_at: '2026-03-30T09:00:00+08:00'\nauthor: a\nstatus: done\n---\n")
    command = (
        "python -c \"import glob,sys; sys.exit(0 if glob.glob('day05/20260330_*.md') else 1)\" && "
        "python scripts/check_metadata.py $(python -c \"import glob; print(sorted(glob.glob('day05/20260330_*.md'))[0])\")"
    )
    assert evaluate({"type": "file_check", "command": command}, "", tmp_path).passed
    (tmp_path / "day05" / "20260330_plan.md").unlink()
    r = evaluate({"type": "file_check", "command": command}, "", tmp_path)
    assert not r.passed and "exit 1" in r.reason  # the first link of the chain failed


def test_file_check_done_log_ignores_stray_min_count(tmp_path):
    (tmp_path / "done.log").write_text("[DONE] 2026-04-13T10:00:00+08:00 | q1_report | done\n")
    command = "python scripts/check_done_log.py done.log --task-prefix q1 --min-count 2"
    assert evaluate({"type": "file_check", "command": command}, "", tmp_path).passed


@pytest.mark.parametrize("command", [
    "python a.py | tee x", "python a.py; touch x", "python a.py > x", "python a.py || true",
    "python a.py &", "echo `id`", "echo $HOME", "(touch x)", "echo 'unterminated",
])
def test_file_check_refuses_shell_syntax(tmp_path, command):
    with pytest.raises(CheckerSpecError):
        evaluate({"type": "file_check", "command": command}, "", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_file_check_other_commands_need_the_command_checker(tmp_path):
    spec = {"type": "file_check", "command": "python -c \"open('x','w')\""}
    with pytest.raises(CheckerSpecError, match="'command' checker"):
        evaluate(spec, "", tmp_path, allowed=["file_check"])
    assert not (tmp_path / "x").exists()
    assert evaluate(spec, "", tmp_path, allowed=["file_check", "command"]).passed


@pytest.mark.parametrize("rest", [
    "-c \"import json,re,sys; pat=re.compile(r'^\\d{4}-\\d{2}(\\.\\[0-9\\]+)?\\+08:00$'); sys.exit(0)\"",
    "scripts/check_iso8601.py day01/sprint_tasks.json tasks[].due_date tasks[].created_at",
    "--dir day03/ --ext json --min-count 2",
    "'single quoted $(not substituted)' \"double \\\"escaped\\\" \\\\ back\"",
    "mixed'quo'\"ting\" a\\ b",
])
def test_shellparse_matches_bash_word_splitting(rest):
    """The words we run are the words bash would pass (for the syntax we support)."""
    out = subprocess.run(["bash", "-c", "ARGS() { printf '%s\\0' \"$@\"; }; ARGS " + rest],
                         capture_output=True, check=True).stdout.decode()
    assert list(parse_command("ARGS " + rest)[0].words[1:]) == out.split("\0")[:-1]
