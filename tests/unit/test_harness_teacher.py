"""harness/teacher.py `serve_teacher`: its log may live in a folder that does not exist yet (a bench run's
folder is created by the run, after the teacher starts), and a teacher that exits is reported with its log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import teacher


def test_a_teacher_that_exits_is_reported_with_its_log_in_a_new_folder(tmp_path: Path, monkeypatch):
    def argv(model_path: str, port: int, max_model_len: int) -> list[str]:
        return [sys.executable, "-c", f"print('no model at {model_path}'); raise SystemExit(3)"]

    monkeypatch.setattr(teacher, "teacher_argv", argv)
    log = tmp_path / "opd-s0" / "teacher.log"  # its folder is not there yet
    with pytest.raises(RuntimeError, match=r"exited \(3\)[\s\S]*no model at /nowhere"):
        with teacher.serve_teacher("/nowhere", teacher.free_port(), log=log):
            pass
    assert log.read_text().strip() == "no model at /nowhere"
