"""Shared test support: servers on loopback, the fake engine, polling, speech fixtures,
the fuzz tests' inputs (`fuzz_inputs`).

Test modules import from here, never from one another.
"""
