"""Compiled kernels kept across starts: torch.compile's cache artifacts, keyed, checked and reloaded.

torch.compile's output (inductor's FX graphs, AOTAutograd's entries, Triton kernels and their tuned
launch settings) is cached on disk by torch itself, under a folder in /tmp that a fresh machine or
container does not have. Each process that builds stage runners therefore keeps what it compiled as
one file, `<cache_dir>/compiled/<stages>-<digest>/artifacts.bin` (torch's portable "mega-cache"
format), and loads it back into torch's caches before its next build, so the compiler finds every
graph it needs instead of tracing and generating it again. Inductor's own cache folder is moved under
`<cache_dir>/compiled/inductor` too (unless TORCHINDUCTOR_CACHE_DIR is set), and Triton's under
`<cache_dir>/compiled/triton` (unless TRITON_CACHE_DIR is set), so a kept cache folder (a volume, an
image layer) carries them all.

The file is keyed by what decides the compiled code: the stages the process builds and their
settings (batch, lengths, dtype, chunking), the model, torch's and Triton's versions and the device
(the GPU's name, or cpu). A changed key is a different folder: nothing of another key is loaded, and
its folder is removed once the new artifacts are kept. An entry that cannot be read back (truncated,
altered, or refused by torch) is removed with a warning and compiled afresh: a cache never fails a
start. Stage processes each keep their own file (their stages differ), so none writes another's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ARTIFACTS = "artifacts.bin"
KEY = "key.json"


@dataclass(frozen=True)
class ArtifactKey:
    """What decides the code torch.compile generates for a process's stages."""

    stages: str  # the stage replicas the process builds, e.g. "thinker0-talker0-code2wav0"
    model: str
    settings: str  # the stages' settings as JSON (the shapes they compile and capture)
    torch: str
    triton: str
    device: str  # the GPU's name, or cpu

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    def changes_from(self, other: dict[str, Any]) -> list[str]:
        """The fields that differ from another key's (read from its key file), for the log."""
        return [k for k, v in asdict(self).items() if other.get(k) != v]


def artifact_key(stages: str, model: str, settings: dict[str, Any], device: torch.device) -> ArtifactKey:
    """The key of a process building `stages` of `model` with `settings` on `device`."""
    try:
        import triton

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    text = json.dumps(settings, sort_keys=True, default=str)
    return ArtifactKey(stages, model, text, str(torch.__version__), triton_version, name)


def use_compile_caches_under(root: Path) -> None:
    """Inductor's cache folder under `root` (`inductor`), unless TORCHINDUCTOR_CACHE_DIR is set, and
    Triton's (`triton`), unless TRITON_CACHE_DIR is set: read by torch and Triton when they first
    compile, so call before that. Inherited by stage processes.

    Triton's folder is named here because otherwise it moves within a process: Triton's own
    `~/.triton/cache` until inductor first builds a kernel launcher, which points it at inductor's
    folder from then on. A kernel of our own (the code predictor's) compiled before that on one start
    and after it on the next is then looked up in the other folder, and compiled again."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    if "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = str(root / "triton")


class CompiledArtifacts:
    """One process's kept artifacts under `root` (`<cache_dir>/compiled`), for `key`."""

    def __init__(self, root: Path, key: ArtifactKey) -> None:
        self.root = root
        self.key = key
        self.folder = root / f"{key.stages}-{key.digest()[:16]}"
        self.loaded = False
        self._misses_at_load = 0

    def load(self) -> bool:
        """Load the kept artifacts into torch's caches; True if there were any. A corrupt entry is
        removed with a warning (the start then compiles afresh and keeps new ones)."""
        if not (self.folder / ARTIFACTS).exists():
            self._say_why_missing()
            return False
        try:
            data = self._read()
            info = torch.compiler.load_cache_artifacts(data)
            if info is None:
                raise ValueError("torch could not read the artifacts back")
        except Exception as e:
            log.warning(
                "compiled artifacts in %s are corrupt (%s: %s); removed, compiling afresh",
                self.folder,
                type(e).__name__,
                e,
            )
            shutil.rmtree(self.folder, ignore_errors=True)
            return False
        self.loaded = True
        self._misses_at_load = compile_counts()[1]
        log.info(
            "compiled artifacts reused: %d entries (%.1f MB) from %s",
            _entries(info),
            len(data) / 1e6,
            self.folder,
        )
        return True

    def save(self) -> bool:
        """Keep what this process compiled (and loaded) so far; True if a new file was written (not
        when everything came from the loaded artifacts). Removes the folders of the same stages kept
        under another key (they would never be loaded again)."""
        hits, misses = compile_counts()
        if hits or misses:
            log.info("compile cache: %d graphs reused, %d compiled", hits, misses)
        if self.loaded and misses == self._misses_at_load:
            return False  # nothing new since the kept artifacts were loaded
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return False  # nothing compiled (the CPU, or compile off)
        data, info = saved
        sha = hashlib.sha256(data).hexdigest()
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}-", dir=self.root))
        try:
            (staging / ARTIFACTS).write_bytes(data)
            key = {**asdict(self.key), "sha256": sha}
            (staging / KEY).write_text(json.dumps(key, indent=1, sort_keys=True))
            shutil.rmtree(self.folder, ignore_errors=True)
            os.replace(staging, self.folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.loaded, self._misses_at_load = True, misses
        for other in self._others():
            shutil.rmtree(other, ignore_errors=True)
        log.info(
            "compiled artifacts kept: %d entries (%.1f MB) in %s",
            _entries(info),
            len(data) / 1e6,
            self.folder,
        )
        return True

    def _read(self) -> bytes:
        key = json.loads((self.folder / KEY).read_text())
        data = (self.folder / ARTIFACTS).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        if key.get("sha256") != sha:
            raise ValueError("the artifacts do not match their checksum")
        if changed := self.key.changes_from(key):
            raise ValueError(f"the key file differs in {', '.join(changed)}")
        return data

    def _others(self) -> list[Path]:
        """Folders of the same stages under other keys."""
        if not self.root.is_dir():
            return []
        prefix = f"{self.key.stages}-"
        return [
            p
            for p in self.root.iterdir()
            if p.is_dir()
            and p != self.folder
            and p.name.startswith(prefix)
            and len(p.name) == len(self.folder.name)
        ]

    def _say_why_missing(self) -> None:
        for other in self._others():
            try:
                changed = self.key.changes_from(json.loads((other / KEY).read_text()))
            except (OSError, ValueError):
                changed = ["(unreadable key)"]
            log.info(
                "compiled artifacts of %s were kept for another %s: not used, compiling afresh",
                self.key.stages,
                ", ".join(changed),
            )
            return
        log.info("no compiled artifacts kept for %s yet: compiling afresh", self.key.stages)


def compile_counts() -> tuple[int, int]:
    """Graphs this process found in torch's compile caches, and graphs it compiled (inductor's FX
    graphs and AOTAutograd's entries)."""
    from torch._dynamo.utils import counters

    hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    misses = counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"]
    return hits, misses


def _entries(info: Any) -> int:
    """Artifacts in a torch CacheInfo."""
    return sum(len(v) for v in getattr(info, "artifacts", {}).values())
