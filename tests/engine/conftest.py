"""Fixtures of the engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from omnivoice.models.loader import load_model


@pytest.fixture(scope="module")
def reference_model(tiny_checkpoint: Path) -> Any:
    """The tiny checkpoint loaded by the real loading code, for transformers' own generate()."""
    torch.set_num_threads(1)
    return load_model(tiny_checkpoint)
