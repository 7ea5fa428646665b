"""Shared test support: servers on loopback, the fake engine, polling, speech fixtures.

Test modules import from here, never from one another.
"""
