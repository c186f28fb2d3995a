"""The base of the config schema (core/config.py): the section model, its error, the repo root and the
custom-resources check the sections share."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def custom_resources(v: dict[str, float], cpu_gpu: str) -> dict[str, float]:
    """Validate a placement dict of Ray custom resources (e.g. {clawray_serve: 1}). CPU and GPU have their
    own fields (`cpu_gpu` names them): Ray refuses them inside an actor's `resources`."""
    if reserved := sorted(set(v) & {"CPU", "GPU", "memory", "object_store_memory"}):
        raise ValueError(f"custom resources only, got {reserved}: set CPU/GPU with {cpu_gpu}")
    if bad := sorted(k for k, n in v.items() if n <= 0):
        raise ValueError(f"resource amounts must be > 0: {bad}")
    return v
