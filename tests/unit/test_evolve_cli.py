"""`clawray skills` sub-app: real commands on a storage root; errors are one line, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.config import SkillsConfig
from evolve.cli import skills_app

SKILL = """---
name: git-workflow
description: "Use when committing: imperative messages, one change per commit."
---

# Git workflow
- `git add <file>`, not `git add .`
"""


def _cli(tmp_path: Path, config_yaml: str):
    """(run(*args) invoking `clawray skills` with that config, a skill folder to add)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(config_yaml)
    folder = tmp_path / "incoming" / "git-workflow"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(SKILL)
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(skills_app, ["--config", str(cfg), *args])

    return run, folder


@pytest.fixture
def env(tmp_path: Path):
    run, folder = _cli(tmp_path, f"storage_root: {tmp_path / 'state'}\n")
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
    # The audit trail names who did it by hand, and from which host (several hosts share a bucket).
    import getpass
    import socket

    from core.config import SkillsConfig
    from evolve.bank import SkillBank
    who = f"manual:{getpass.getuser()}@{socket.gethostname()}"
    hist = SkillBank(tmp / "state" / "skills", SkillsConfig()).history()
    assert [(h["action"], h["evolver"]) for h in hist] == [("add", who), ("remove", who)]


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


# ------------------------------------------------------------------------------------------ versions
def _state(tmp: Path) -> dict[str, bytes]:
    root = tmp / "state" / "skills"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _two_versions(run, folder: Path) -> None:
    assert run("add", str(folder)).exit_code == 0
    (folder / "SKILL.md").write_text(SKILL + "- `git status` before every commit\n")
    r = run("add", "--update", str(folder))
    assert r.exit_code == 0 and "updated; generation 2" in r.output, r.output


def test_history_diff_and_rollback(env):
    run, folder, tmp = env
    _two_versions(run, folder)
    skill_md = tmp / "state" / "skills" / "git-workflow" / "SKILL.md"
    r = run("history")
    assert r.exit_code == 0 and "add" in r.output and "update" in r.output and "generation 2" in r.output
    r = run("history", "git-workflow", "-n", "1")
    assert r.exit_code == 0 and "update" in r.output and "add " not in r.output
    r = run("diff", "git-workflow")  # previous vs latest
    assert r.exit_code == 0 and "--- git-workflow v1" in r.output and "+++ git-workflow v2" in r.output
    assert "+- `git status` before every commit" in r.output
    v1 = run("diff", "git-workflow", "1", "1")
    assert v1.exit_code == 0 and "identical" in v1.output
    r = run("rollback", "git-workflow", "--to", "1")
    assert r.exit_code == 0 and "git-workflow: rolled back to version 1 (now version 3); generation 3" in r.output
    assert "`git status`" not in skill_md.read_text()
    r = run("diff", "git-workflow", "1", "3")
    assert r.exit_code == 0 and "identical" in r.output  # byte for byte the old text
    r = run("rollback", "git-workflow", "--to", "1")
    assert r.exit_code == 0 and "already holds the text of version 1; nothing changed; generation 3" in r.output
    r = run("history", "git-workflow")
    assert r.exit_code == 0 and "rollback" in r.output
    r = run("rollback", "--generation", "0")  # the whole library, as it was before anything
    assert r.exit_code == 0 and "removed git-workflow; generation 4" in r.output, r.output
    assert not skill_md.exists()
    r = run("rollback", "--generation", "2")
    assert r.exit_code == 0 and "restored git-workflow; generation 5" in r.output, r.output
    assert "`git status`" in skill_md.read_text()


@pytest.mark.parametrize("args, msg", [
    (("rollback", "nope", "--to", "1"), "no stored versions of skill 'nope'"),
    (("rollback", "git-workflow", "--to", "9"), "has no version 9"),
    (("rollback", "git-workflow", "--to", "1", "--generation", "1"), "got --to and --generation"),
    (("rollback",), "give exactly one of --to, --generation, --at"),
    (("rollback", "--to", "1"), "--to needs the skill NAME"),
    (("rollback", "git-workflow", "--generation", "1"), "rolls back the whole library"),
    (("rollback", "--generation", "7"), "ahead of"),
    (("rollback", "--at", "soon"), "not an ISO 8601 time"),
    (("diff", "nope"), "no stored versions of skill 'nope'"),
    (("diff", "git-workflow", "1", "5"), "has no version 5"),
    (("history", "nope"), "no history for skill 'nope'"),
    (("history", "../x"), "invalid skill name"),
])
def test_bad_version_requests_are_one_line_errors_that_change_nothing(env, args, msg):
    run, folder, tmp = env
    _two_versions(run, folder)
    before = _state(tmp)
    r = run(*args)
    assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output, r.output
    assert r.output.strip().count("\n") == 0
    assert _state(tmp) == before


def test_rollback_through_the_bucket_publishes_the_restored_text(s3_root: str, tmp_path: Path):
    from evolve.bank import SkillBank
    from evolve.mirror import SkillMirror

    run, folder = _cli(tmp_path, f"storage_root: {s3_root}\ncache_dir: {tmp_path / 'cache'}\n"
                                 "state: {dsn: 'postgresql://clawray@db.invalid:5432/clawray'}\n")
    _two_versions(run, folder)
    r = run("rollback", "git-workflow", "--to", "1")
    assert r.exit_code == 0 and "(now version 3); generation 3; published as version 3" in r.output, r.output
    mirror = SkillMirror(s3_root, tmp_path / "evolver")  # what any host pulls
    mirror.pull()
    bank = SkillBank(mirror.folder, SkillsConfig())
    assert (mirror.folder / "git-workflow" / "SKILL.md").read_text() == bank.text_at("git-workflow", 1)
    assert bank.version_of("git-workflow") == 3 and bank.history()[-1]["action"] == "rollback"
    r = run("history", "git-workflow")
    assert r.exit_code == 0 and "rollback" in r.output
    r = run("rollback", "--generation", "0")
    assert r.exit_code == 0 and "removed git-workflow; generation 4; published as version 4" in r.output
