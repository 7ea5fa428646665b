"""Logging setup shared by the CLI and the stage processes it starts."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(processName)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Configure the root logger once, for the whole process (uvicorn's loggers propagate to it)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S", force=True)
