"""Hypothesis profiles for the fuzz tests, chosen with HYPOTHESIS_PROFILE (default `ci`).

`ci`: a moderate number of examples, so the whole folder runs in about a minute on two cores.
`long`: a standalone fuzzing run, a hundred times the examples of `ci` (see docs/development.md,
Fuzzing). No deadline in either: a slow example on a loaded machine is not a failure.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("ci", max_examples=100, deadline=None, suppress_health_check=_QUIET)
settings.register_profile(
    "long", max_examples=10_000, deadline=None, suppress_health_check=_QUIET, report_multiple_bugs=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
