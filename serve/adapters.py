"""Versioned LoRA bookkeeping for one engine replica: which versions are loaded, which is active.

Pure state (no vLLM, no Ray) so the invariants are unit-tested: activation is one assignment (atomic for
new requests); a request pins the version it resolved at its start; a version is removed from the engine
only when no in-flight request still uses it; versions beyond the retention window are retired.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from core.contracts import parse_adapter_name


@dataclass
class AdapterRegistry:
    base_name: str  # the served base model id
    alias: str  # the id that means "whatever is active"
    retention: int = 3  # loaded versions kept (the active one always is)
    loaded: OrderedDict[str, str] = field(default_factory=OrderedDict)  # name -> path, load order
    active: str | None = None  # None = base model
    inflight: dict[str, int] = field(default_factory=dict)
    retiring: set[str] = field(default_factory=set)  # unload requested, waiting for in-flight to drain

    def resolve(self, requested: str | None) -> str | None:
        """Map a request's `model` to an adapter name (None = base). Unknown ids mean the policy, and so does
        a value that is not a string (the Proxy refuses those first; the engine's handle has other callers)."""
        if not isinstance(requested, str):
            return self.active
        if requested == self.base_name:
            return None
        if requested in self.loaded and requested not in self.retiring:
            return requested
        return self.active

    def begin(self, name: str | None) -> None:
        if name is not None:
            self.inflight[name] = self.inflight.get(name, 0) + 1

    def end(self, name: str | None) -> list[str]:
        """Finish a request on `name`; returns versions that may now be removed from the engine."""
        if name is None:
            return []
        n = self.inflight.get(name, 0) - 1
        if n <= 0:
            self.inflight.pop(name, None)
            if name in self.retiring:
                return [name]
        else:
            self.inflight[name] = n
        return []

    def add(self, name: str, path: str) -> None:
        parse_adapter_name(name)  # only versioned names: a changed folder must get a new name
        self.loaded[name] = path
        self.retiring.discard(name)

    def activate(self, name: str | None) -> None:
        if name is not None and (name not in self.loaded or name in self.retiring):
            raise KeyError(f"adapter {name!r} is not loaded")
        self.active = name

    def retire(self, name: str) -> list[str]:
        """Mark `name` for unloading; returns it if it can be removed right now."""
        if name not in self.loaded:
            raise KeyError(f"adapter {name!r} is not loaded")
        if name == self.active:
            raise ValueError(f"adapter {name!r} is active; activate another version first")
        self.retiring.add(name)
        return [name] if self.inflight.get(name, 0) == 0 else []

    def forget(self, name: str) -> None:
        self.loaded.pop(name, None)
        self.retiring.discard(name)

    def over_retention(self) -> list[str]:
        """Oldest non-active versions beyond the retention window."""
        keep = [n for n in self.loaded if n not in self.retiring]
        extra = len(keep) - self.retention
        victims = [n for n in keep if n != self.active][: max(extra, 0)]
        return victims

    def snapshot(self) -> dict:
        return {
            "base": self.base_name,
            "alias": self.alias,
            "active": self.active,
            "loaded": [n for n in self.loaded if n not in self.retiring],
            "retiring": sorted(self.retiring),
            "inflight": dict(self.inflight),
        }
