"""Connectors carry stage messages between workers: in-process queues or shared memory; and the
engine core's outputs to the server over a pipe (pipe.py)."""

from omnivoice.engine.connectors.base import Connector
from omnivoice.engine.connectors.local import LocalConnector
from omnivoice.engine.connectors.shm import ShmConnector

__all__ = ["Connector", "LocalConnector", "ShmConnector"]
