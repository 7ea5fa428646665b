"""Build a folder of generated model files once and keep it in a versioned cache folder.

The tiny checkpoint and the dummy model's tokenizer are made from code, never downloaded; building
them again at every start would be wasted work, and processes that start together must not see
each other's half-written files.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "omnivoice"


def build_once(cache_dir: Path | str | None, name: str, marker: str, build: Callable[[Path], None]) -> Path:
    """Return `<cache_dir>/<name>`, calling `build(folder)` to fill it first when it is not there yet.

    `name` carries the recipe's version, so a changed recipe builds a new folder; `marker` is a file
    every complete build has. The build goes to a temporary sibling folder renamed into place, so a
    reader never sees a half-written folder and processes racing to build it both end up with one
    complete copy. Default cache dir: ~/.cache/omnivoice.
    """
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache_dir / name
    if (target / marker).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir))
    try:
        logger.info("building %s into %s", name, target)
        started = time.perf_counter()
        build(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / marker).is_file():
                raise
            logger.info("another process built %s first; using its copy", target)
        else:
            logger.info("built %s in %.1f s", name, time.perf_counter() - started)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
