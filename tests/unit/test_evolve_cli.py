"""`clawray skills` sub-app: real commands on a storage root; errors are one line, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.cli import skills_app

SKILL = """---
name: git-workflow
description: "Use when committing: imperative messages, one change per commit."
---

# Git workflow
- `git add <file>`, not `git add .`
"""


@pytest.fixture
def env(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"storage_root: {tmp_path / 'state'}\n")
    folder = tmp_path / "incoming" / "git-workflow"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(SKILL)
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(skills_app, ["--config", str(cfg), *args])

    return run, folder, tmp_path


def test_add_list_show_log_remove(env):
    run, folder, tmp = env
    r = run("add", str(folder))
    assert r.exit_code == 0 and "git-workflow: added; generation 1" in r.output
    assert (tmp / "state" / "skills" / "git-workflow" / "SKILL.md").is_file()
    r = run("list")
    assert r.exit_code == 0 and "git-workflow" in r.output and "generation 1" in r.output
    r = run("show", "git-workflow")
    assert r.exit_code == 0 and "name: git-workflow" in r.output and "git add <file>" in r.output
    r = run("log")
    assert r.exit_code == 0 and "add" in r.output and "manual" in r.output
    r = run("remove", "git-workflow")
    assert r.exit_code == 0 and "removed; generation 2" in r.output
    assert not (tmp / "state" / "skills" / "git-workflow").exists()


@pytest.mark.parametrize("args, msg", [
    (("show", "nope"), "no skill named 'nope'"),
    (("remove", "../etc"), "invalid skill name"),
    (("remove", "nope"), "no skill named 'nope'"),
    (("add", "/does/not/exist"), "cannot read"),
])
def test_errors_are_one_line_without_traceback(env, args, msg):
    run, _, _ = env
    r = run(*args)
    assert r.exit_code == 1
    assert msg in r.output and "Traceback" not in r.output
    assert r.output.strip().count("\n") == 0


def test_duplicate_and_malformed_add_are_refused(env):
    run, folder, tmp = env
    assert run("add", str(folder)).exit_code == 0
    r = run("add", str(folder / "SKILL.md"))
    assert r.exit_code == 1 and "already exists" in r.output
    bad = tmp / "bad.md"
    bad.write_text("no front matter")
    r = run("add", str(bad))
    assert r.exit_code == 1 and "front matter" in r.output


def test_missing_config_is_a_clear_error(tmp_path: Path):
    r = CliRunner().invoke(skills_app, ["--config", str(tmp_path / "none.yaml"), "list"])
    assert r.exit_code == 1 and "does not exist" in r.output and "Traceback" not in r.output
