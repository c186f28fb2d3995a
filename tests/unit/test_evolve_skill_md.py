"""SKILL.md parsing/rendering: round trips, MetaClaw / SkillClaw compatibility, refusals."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.contracts import Skill
from evolve.skill_md import SkillFormatError, content_key, parse_skill_md, render_skill_md

# Written in the style of MetaClaw's memory_data/skills/*/SKILL.md: no category, quoted description.
METACLAW_STYLE = """---
name: debug-systematically
description: "Use when diagnosing a bug: gather evidence before forming hypotheses. NOT for typos."
---

# Debug Systematically

1. Reproduce the failure.
2. Read the error message **completely**.
"""

# MetaClaw reads front matter line by line, so its files may hold YAML-invalid lines like this one.
METACLAW_LINE_STYLE = """---
name: plan-first
description: Use when: the task has several steps
category: productivity
---
Write the plan down first.
"""

# SkillClaw / OpenClaw style: category under metadata.skillclaw, a JSON flow mapping, extra keys.
SKILLCLAW_STYLE = """---
name: secure-code-review
description: "Review code for injection, secrets and unsafe deserialisation.
  NOT for: style nits."
homepage: https://example.invalid/skills/secure-code-review
user-invocable: true
category: general
metadata:
  {
    "openclaw": { "emoji": "🔒" },
    "skillclaw": { "category": "security" }
  }
---

# Secure code review
- grep for `eval(`
"""


def test_round_trip_keeps_every_field():
    skill = Skill(name="backup-before-modifying", description="Create a .bak copy: always.",
                  category="file_operations", body="# Backup\n\n- `cp f f.bak`\n- then edit",
                  metadata={"origin_sessions": ["s1", "s2"], "version": 3, "lesson": "x: y"})
    assert parse_skill_md(render_skill_md(skill)) == skill
    assert render_skill_md(parse_skill_md(render_skill_md(skill))) == render_skill_md(skill)


def test_round_trip_without_metadata_or_body():
    skill = Skill(name="ab", description="d")
    text = render_skill_md(skill)
    assert "metadata" not in text
    assert parse_skill_md(text) == skill


def test_metaclaw_style_file_loads_unchanged():
    skill = parse_skill_md(METACLAW_STYLE, folder_name="debug-systematically")
    assert skill.name == "debug-systematically"
    assert skill.category == "general"  # MetaClaw's default
    assert skill.description.startswith("Use when diagnosing a bug: gather")
    assert skill.body.startswith("# Debug Systematically") and "**completely**" in skill.body
    assert skill.metadata == {}


def test_metaclaw_line_style_front_matter_is_read_like_metaclaw():
    skill = parse_skill_md(METACLAW_LINE_STYLE)
    assert skill.description == "Use when: the task has several steps"
    assert skill.category == "productivity"
    assert skill.body == "Write the plan down first."


def test_skillclaw_style_category_and_extra_keys_move_into_metadata():
    skill = parse_skill_md(SKILLCLAW_STYLE)
    assert skill.category == "security"  # metadata.skillclaw.category wins over `category`
    assert skill.metadata["openclaw"] == {"emoji": "🔒"}
    assert skill.metadata["homepage"].endswith("/secure-code-review")
    assert skill.metadata["user-invocable"] is True
    assert "NOT for: style nits." in skill.description
    again = parse_skill_md(render_skill_md(skill))
    assert again == skill


def test_crlf_and_bom_are_tolerated():
    text = "\ufeff" + METACLAW_STYLE.replace("\n", "\r\n")
    assert parse_skill_md(text).name == "debug-systematically"


@pytest.mark.parametrize("text, why", [
    ("# no front matter", "no YAML front matter"),
    ("---\nname: ab\ndescription: d\n", "not closed"),
    ("---\ndescription: d\n---\n", "no `name`"),
    ("---\nname: ab\n---\n", "no `description`"),
    ("---\n- a\n- b\n---\n", "must be a mapping"),
    ("---\nname: ../../etc/passwd\ndescription: d\n---\n", "name"),
    ("---\nname: Upper-Case\ndescription: d\n---\n", "name"),
    ("---\nname: " + "a" * 65 + "\ndescription: d\n---\n", "name"),
    ("---\nname: ab\ndescription: " + "x" * 1025 + "\n---\n", "description"),
    ("---\nname: ab\ndescription: d\nmetadata: [1, 2]\n---\n", "metadata"),
])
def test_malformed_files_are_refused_with_a_reason(text, why):
    with pytest.raises(SkillFormatError, match=why):
        parse_skill_md(text)


def test_folder_name_must_match():
    with pytest.raises(SkillFormatError, match="differs from its folder"):
        parse_skill_md(METACLAW_STYLE, folder_name="other-name")


def test_traversal_and_oversized_names_are_refused_by_the_contract():
    for bad in ("../x", "a/b", "..", "x", "a" * 65, "-ab", "A-b"):
        with pytest.raises(ValidationError):
            Skill(name=bad, description="d")


def test_content_key_ignores_metadata_only():
    a = Skill(name="ab", description="d", body="b", metadata={"version": 1})
    assert content_key(a) == content_key(a.model_copy(update={"metadata": {"version": 9}}))
    assert content_key(a) != content_key(a.model_copy(update={"body": "c"}))
