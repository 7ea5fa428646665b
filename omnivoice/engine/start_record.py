"""The step times of the last complete engine start, kept to tell the next start what to expect.

Kept in `<cache_dir>/starts/<digest>.json`, one file per model, stage settings and torch version (a
start of other settings takes other times). A file that cannot be read is not used, with a warning: a
record never fails a start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from omnivoice.config import Profile
from omnivoice.models.build_cache import default_cache_dir

log = logging.getLogger(__name__)


def start_record(profile: Profile, source: object) -> StartRecord:
    """The kept start times of `profile` serving `source` (its model)."""
    import torch

    cache = Path(profile.model.cache_dir).expanduser() if profile.model.cache_dir else default_cache_dir()
    key = {"model": str(source), "stages": profile.stages.model_dump(mode="json"), "torch": torch.__version__}
    return StartRecord(cache / "starts", key)


class StartRecord:
    """The step times of the last complete start, kept per model, stage settings and torch version."""

    def __init__(self, root: Path, key: dict[str, Any]) -> None:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        self.path = root / f"{digest[:16]}.json"

    def load(self) -> tuple[dict[str, float], float]:
        """The kept step times and the whole start's seconds (none if there is no record, or it
        cannot be read: a record never fails a start)."""
        try:
            data = json.loads(self.path.read_text())
            return {str(k): float(v) for k, v in data["steps"].items()}, float(data["total_s"])
        except FileNotFoundError:
            return {}, 0.0
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("start times in %s unreadable (%s); not used", self.path, e)
            return {}, 0.0

    def save(self, steps: dict[str, float], total_s: float) -> None:
        """Keep this start's step times (written whole: a reader never sees half a file)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".start-", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump({"total_s": round(total_s, 2), "steps": steps}, f, indent=1)
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("could not keep the start times in %s: %s", self.path, e)
