"""The model a profile serves, named without being loaded: a checkpoint folder or a `dummy:` source.

A module that imports neither torch nor transformers (only the tiny default model, built on a first
start, needs them), so that the server can start the engine core before its own heavy imports: the
core's minutes of start then run beside them (engine/core/launch.py).
"""

from __future__ import annotations

from pathlib import Path

from omnivoice.config import Profile
from omnivoice.models.dummy_source import DummySource, parse_source


def resolve_model_path(profile: Profile) -> Path | DummySource:
    """The model to serve: the profile's checkpoint or dummy model, else the tiny default (built once)."""
    if profile.model.path is not None:
        dummy = parse_source(profile.model.path)
        if dummy is not None:
            return dummy
        path = Path(profile.model.path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path {path} is not a Hugging Face checkpoint folder (no config.json)"
            )
        return path
    from omnivoice.models.tiny import ensure_tiny_checkpoint

    cache = Path(profile.model.cache_dir).expanduser() if profile.model.cache_dir else None
    return ensure_tiny_checkpoint(cache)
