"""Shared fixtures. The tiny Qwen3-Omni checkpoint is built once per test session."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnivoice.models.tiny import ensure_tiny_checkpoint


@pytest.fixture(scope="session", autouse=True)
def _no_api_key_from_the_environment() -> Iterator[None]:
    """Servers in tests have API keys only when a test gives them some (never the developer's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("OMNIVOICE_API_KEY", raising=False)
        yield


@pytest.fixture(autouse=True)
def _root_logging_as_it_was() -> Iterator[None]:
    """A test that runs a command's main() has `configure_logging` point the root logger at the stderr
    pytest captured for that test, which pytest closes after it; later tests' server threads then log
    into a closed file ("--- Logging error ---" in the output). Each test gets the root logger back as
    it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of the tiny random-weight checkpoint (Hugging Face layout), built once per session.

    Set OMNIVOICE_TEST_CACHE to a folder to keep the build across sessions; its versioned subfolder is
    rebuilt only when the recipe's version changes.
    """
    cache = os.environ.get("OMNIVOICE_TEST_CACHE")
    cache_dir = Path(cache) if cache else tmp_path_factory.mktemp("omnivoice-cache")
    return ensure_tiny_checkpoint(cache_dir)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with slow end-to-end tests first, each file's tests in their order. Under pytest-xdist
    (`--dist loadfile`) a file runs whole on one worker and files are handed out in this order, so the
    long files start at once and the short ones fill the gaps, instead of one worker ending the run
    alone on a long file picked up last."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the order within a file stays
