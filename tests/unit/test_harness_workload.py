from pathlib import Path

import pytest

from core.config import REPO_ROOT
from harness.driver import score_round
from harness.tools import run_tool
from harness.workload import Round, load_workload, replayable

SHARED = REPO_ROOT.parent / "shared" / "metaclaw-bench-small"


def test_project_workload_loads_and_is_fully_replayable():
    w = load_workload(REPO_ROOT / "workloads" / "clawray-mini")
    assert [d.id for d in w.days] == ["day01", "day02", "day03"]
    assert all(not d.skipped and d.rounds for d in w.days)
    assert "Kit" in w.persona()


@pytest.mark.skipif(not SHARED.exists(), reason="reference data not present")
def test_reference_benchmark_rounds_without_fixtures_are_skipped_with_reasons():
    w = load_workload(SHARED)
    skipped = [s for d in w.days for s in d.skipped]
    assert skipped and all("does not ship" in s for s in skipped)


def test_builtin_checker_scripts_need_no_fixture():
    r = Round("r", "file_check", "q", {"command": "python scripts/check_backup.py a.json"}, {})
    assert replayable(r, None) is None
    r2 = Round("r", "file_check", "q", {"command": "python scripts/custom.py"}, {})
    assert "custom.py" in replayable(r2, None)


def test_tools_stay_inside_the_workspace(tmp_path: Path):
    assert run_tool(tmp_path, "write_file", '{"path": "a/b.txt", "content": "x"}') == "wrote a/b.txt"
    assert (tmp_path / "a" / "b.txt").read_text() == "x"
    assert "escapes" in run_tool(tmp_path, "write_file", '{"path": "../evil.txt", "content": "x"}')
    assert not (tmp_path.parent / "evil.txt").exists()
    assert run_tool(tmp_path, "read_file", "not json").startswith("error")


def test_multi_choice_feedback_names_the_wrong_options(tmp_path: Path):
    r = Round("r", "multi_choice", "q", {"options": {"A": "a", "B": "b"}, "answer": ["B"]},
              {"correct": "yes", "options": {"A": "A is wrong: reason-a", "B": "B is right"}})
    score, passed, fb = score_round(r, "\\bbox{A}", tmp_path, "u")
    assert score == 0.0 and not passed and "reason-a" in fb and "B is right" in fb
    score, passed, fb = score_round(r, "\\bbox{B}", tmp_path, "u")
    assert score == 1.0 and passed and fb == "yes"


def test_a_file_task_starts_from_a_snapshot_of_the_users_files_as_they_are_then(tmp_path):
    from harness.driver import snapshot_workspace

    (tmp_path / "mei" / "day02").mkdir(parents=True)
    (tmp_path / "mei" / "day02" / "config.json").write_text('{"retries": 5}')
    rel = snapshot_workspace(tmp_path, "mei", "mei-day02", "r3")
    assert rel == ".snapshots/mei-day02/r3"
    (tmp_path / "mei" / "day02" / "config.json").write_text('{"retries": 9}')  # the task changes the file
    assert (tmp_path / rel / "day02" / "config.json").read_text() == '{"retries": 5}'
    assert snapshot_workspace(tmp_path, "mei", "mei-day02", "r3") == rel  # a replayed round: taken again
    assert (tmp_path / rel / "day02" / "config.json").read_text() == '{"retries": 9}'
