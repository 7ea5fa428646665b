"""The name of a `dummy:` model source (models/dummy.py builds it), in a module that imports neither
torch nor transformers: processes are handed one (the engine core's, the stage processes') and
unpickle it before they import anything else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnivoice.config import DUMMY_MODELS, DUMMY_PREFIX


@dataclass(frozen=True)
class DummySource:
    """A `dummy:<name>` model source; `overrides` (nested, merged into the config) shrinks it for tests."""

    name: str
    seed: int = 0
    overrides: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __str__(self) -> str:
        return DUMMY_PREFIX + self.name + (" (overridden)" if self.overrides else "")


def parse_source(path: str) -> DummySource | None:
    """The DummySource named by a `model.path` of the form `dummy:<name>`, else None."""
    if not path.startswith(DUMMY_PREFIX):
        return None
    name = path[len(DUMMY_PREFIX) :]
    if name not in DUMMY_MODELS:
        raise ValueError(f"unknown dummy model {name!r}; known: {sorted(DUMMY_MODELS)}")
    return DummySource(name)
