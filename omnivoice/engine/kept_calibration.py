"""The last calibration's step times, kept so that the next start of the same stages on the same
devices skips the calibration burst.

The calibration (engine/calibration.py) times each stage worker's decode steps at every batch bucket,
and admission's capacity is fitted to those step times. They depend on the model, the stage settings,
torch, the devices and the way the calibration times them only, so the figures of one start hold for
the next start of the same key: each worker's step times after the calibration are kept in
`<cache_dir>/calibrations/<model digest>.json` with that key. A start whose key matches seeds the
dispatcher with them, the way a restart's new workers start from their predecessors' step times
(engine/dispatch.py): admission knows the capacity before the first request, and served steps replace
the kept figures size by size (the warm-up burst's steps are not timed: messages.TimeSteps). A changed
key calibrates afresh (the log says what changed) and keeps the new figures in place of the old ones;
a file that cannot be read calibrates, with a warning: a kept calibration never fails a start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from omnivoice.config import Profile
from omnivoice.models.build_cache import default_cache_dir
from omnivoice.types import STAGES, Capacity, StageStats

log = logging.getLogger(__name__)

StepTimes = tuple[tuple[int, float, int], ...]  # (batch size, step seconds, steps) per size
Workers = dict[tuple[str, int], StepTimes]
KEY_WORDS = {
    "model": "model",
    "stages": "stage settings",
    "torch": "torch version",
    "devices": "devices",
    "method": "calibration method",
}
# how the calibration times the steps (engine/calibration.py); raised when a change to it makes the
# figures kept by the old way wrong (2: the bursts a stage with graphs left for later did not time
# run again, where before its wide sizes could go untimed; 3: the bursts go up to the thinker's and
# talker's max_batch, not Code2Wav's, which left them untimed past a narrower Code2Wav's)
METHOD = 3


class Seeded(Protocol):
    """The engine as a kept calibration sees it (engine/dispatch.py seeds the step times)."""

    def replica_stats(self) -> tuple[StageStats, ...]: ...

    def seed_step_times(self, workers: Workers) -> None: ...

    def capacity(self) -> Capacity: ...


def calibration_key(profile: Profile, source: object) -> dict[str, Any]:
    """What the step times of `profile` serving `source` depend on: the model, the stage settings (but
    `capacity.reuse_calibration` and `start_method`, which change no step), torch's version and the
    name of each stage replica's device, and the calibration's METHOD."""
    import torch

    stages = profile.stages.model_dump(mode="json")
    stages.pop("start_method")
    stages["capacity"].pop("reuse_calibration")
    devices = device_names(profile)
    return {
        "model": str(source),
        "stages": stages,
        "torch": torch.__version__,
        "devices": devices,
        "method": METHOD,
    }


def device_names(profile: Profile) -> dict[str, str]:
    """Each stage replica's device by name (a GPU's model, `cpu`), as `thinker#0: NVIDIA ...`."""
    names = {}
    for s in STAGES:
        cfg = profile.stages.stage(s)
        for r in range(cfg.replicas):
            names[f"{s}#{r}"] = _device_name(cfg.replica_device(r))
    return names


def _device_name(device: str) -> str:
    if not device.startswith("cuda"):
        return device.split(":")[0]
    import torch

    try:
        return str(torch.cuda.get_device_name(torch.device(device)))
    except (RuntimeError, AssertionError, ValueError):  # not visible here (a Ray actor's elsewhere)
        return device


class KeptCalibration:
    """The kept step times of the calibration of one model (see the module docstring)."""

    def __init__(self, root: Path, key: dict[str, Any], enabled: bool = True) -> None:
        self.key = key
        self.enabled = enabled  # False: never reused (still kept)
        digest = hashlib.sha256(str(key["model"]).encode()).hexdigest()
        self.path = root / f"{digest[:16]}.json"

    @classmethod
    def of(cls, profile: Profile, source: object) -> KeptCalibration:
        """The kept calibration of `profile` serving `source`, under the profile's cache folder."""
        given = profile.model.cache_dir
        cache = Path(given).expanduser() if given else default_cache_dir()
        key = calibration_key(profile, source)
        return cls(cache / "calibrations", key, profile.stages.capacity.reuse_calibration)

    def reuse(self, engine: Seeded) -> bool:
        """Seed `engine` with the kept step times if they hold for its key and its workers; True if it
        was seeded (the calibration burst is then skipped). Logs either way."""
        workers = {(w.name, w.replica) for w in engine.replica_stats()}
        found = self.load() if self.enabled else "stages.capacity.reuse_calibration is off"
        if isinstance(found, tuple) and set(found[0]) != workers:
            found = f"the kept calibration in {self.path} is of other stage workers"
        if not isinstance(found, tuple):
            log.info("calibrating: %s", found)
            return False
        times, saved = found
        engine.seed_step_times(times)
        capacity = engine.capacity()
        log.info(
            "reusing the calibration of %s (%s): %s real-time audio streams (%s)",
            saved,
            self.path,
            capacity.streams,
            ", ".join(f"{name} {n}" for name, n in capacity.stages),
        )
        return True

    def load(self) -> tuple[Workers, str] | str:
        """The kept step times of this key and when they were measured, or why there are none."""
        try:
            data = json.loads(self.path.read_text())
            kept, saved = data["key"], str(data["saved"])
            workers = {(str(w["stage"]), int(w["replica"])): _times(w["step_times"]) for w in data["workers"]}
            if not isinstance(kept, dict):
                raise TypeError("its key is not a mapping")
        except FileNotFoundError:
            return f"no calibration kept for {self.key['model']} yet"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("the kept calibration in %s is unreadable (%s); not used", self.path, e)
            return f"the kept calibration in {self.path} is unreadable"
        changed = [KEY_WORDS.get(k, k) for k, v in self.key.items() if kept.get(k) != v]
        if changed:
            return f"the calibration of {saved} ({self.path}) was of other {', '.join(changed)}"
        return workers, saved

    def save(self, workers: Sequence[StageStats]) -> None:
        """Keep the workers' step times for this key, in place of what was kept for the model (written
        whole: a reader never sees half a file); nothing if a worker timed no step."""
        if untimed := [f"{w.name}#{w.replica}" for w in workers if not w.step_times]:
            log.info("calibration not kept: %s timed no step", ", ".join(untimed))
            return
        body = {
            "key": self.key,
            "saved": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "workers": [
                {"stage": w.name, "replica": w.replica, "step_times": [list(x) for x in w.step_times]}
                for w in workers
            ],
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".calibration-", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(body, f, indent=1)
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("could not keep the calibration in %s: %s", self.path, e)


def _times(rows: list[Any]) -> StepTimes:
    """Kept (batch, seconds, steps) rows, checked: a size of at least 1, a finite non-negative time."""
    out = []
    for b, t, n in rows:
        batch, seconds, steps = int(b), float(t), int(n)
        if batch < 1 or steps < 0 or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a step time out of range: {[b, t, n]}")
        out.append((batch, seconds, steps))
    return tuple(sorted(out))
