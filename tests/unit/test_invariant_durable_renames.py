"""Issue 12 item 9: a rename is durable only once its parent directory is fsynced.

After a power loss, a renamed-in file or folder may vanish unless the directory that holds the new entry
was fsynced after the rename. Every atomic publish (core/storage.py's atomic writes, the adapter publish,
the skill bank's folder renames) must fsync that directory after renaming. The test records the
sequence of renames and of fsyncs of directories, through the real os calls.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from core.config import LoRAConfig, SkillsConfig
from core.contracts import Skill
from core.storage import atomic_write_text
from evolve.bank import SkillBank
from train.publish import publish_adapter


@pytest.fixture
def events(monkeypatch) -> list[tuple[str, str]]:
    """("rename", destination) and ("fsync-dir", directory) in the order they happened."""
    log: list[tuple[str, str]] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            log.append(("fsync-dir", os.path.realpath(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst, *a, **kw):
        real_rename(src, dst, *a, **kw)
        log.append(("rename", os.path.realpath(dst)))

    def replace(src, dst, *a, **kw):
        real_replace(src, dst, *a, **kw)
        log.append(("rename", os.path.realpath(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    return log


def _parent_fsynced_after(log: list[tuple[str, str]], target: Path) -> bool:
    """Whether `target`'s directory was fsynced after `target` was renamed in and before the next rename
    (so a later atomic write into the same directory does not count for this one)."""
    target_s = os.path.realpath(target)
    renames = [i for i, e in enumerate(log) if e == ("rename", target_s)]
    assert renames, f"{target} was never renamed into place: {log}"
    after = log[renames[-1] + 1:]
    until = next((i for i, e in enumerate(after) if e[0] == "rename"), len(after))
    return ("fsync-dir", os.path.dirname(target_s)) in after[:until]


def test_atomic_write_fsyncs_the_parent_directory_after_the_rename(tmp_path: Path, events):
    path = tmp_path / "state" / "active.json"
    atomic_write_text(path, "{}")
    assert path.read_text() == "{}"
    assert _parent_fsynced_after(events, path), events


class _FakePeft:
    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text("{}")


def test_adapter_publish_fsyncs_the_adapters_directory_after_the_rename(tmp_path: Path, events):
    adapters = tmp_path / "adapters"
    name, folder = publish_adapter(_FakePeft(), adapters, base_model="tiny", lora=LoRAConfig(), step=1,
                                   skill_generation=0, metrics={})
    assert name == "policy-v0001" and (folder / "manifest.json").is_file()
    assert _parent_fsynced_after(events, folder), events


def test_skill_bank_folder_renames_fsync_the_library_directory(tmp_path: Path, events):
    bank = SkillBank(tmp_path / "skills", SkillsConfig())
    bank.add(Skill(name="check-twice", description="Check the result before reporting."))
    assert _parent_fsynced_after(events, bank.root / "check-twice"), events
    events.clear()
    bank.remove("check-twice")
    trash = [dst for kind, dst in events if kind == "rename" and "/.trash-check-twice-" in dst]
    assert trash and _parent_fsynced_after(events, Path(trash[0])), events
