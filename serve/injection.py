"""Skill injection at the Proxy (filled in by the skills plane integration)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.config import SkillsConfig


class SkillInjector:
    """Retrieves skills for the last user message and puts them into the system message."""

    @classmethod
    def build(cls, cfg: SkillsConfig, skills_dir: Path) -> SkillInjector | None:
        return None

    def start(self) -> None:
        pass

    def inject(self, body: dict[str, Any], anthropic: bool) -> tuple[list[str], int]:
        return [], 0
