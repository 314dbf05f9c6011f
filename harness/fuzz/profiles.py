"""The Hypothesis profiles the tests and the fuzzer share, chosen by HYPOTHESIS_PROFILE.

dev: fast; ci: derandomised, no deadline, blob printed; nightly: many examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILES = ("dev", "ci", "nightly")

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


def profile_from_environment() -> str:
    return os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
