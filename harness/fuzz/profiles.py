"""The Hypothesis profiles the tests and the fuzzer share, chosen by HYPOTHESIS_PROFILE.

dev: fast; ci: derandomised, no deadline, blob printed; nightly: many examples.
"""

from __future__ import annotations

import os
import re

from hypothesis import HealthCheck, settings

PROFILES = ("dev", "ci", "nightly")

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


def profile_from_environment() -> str:
    return os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")


_REPRODUCE = re.compile(r"@reproduce_failure\([^)]*\)")


def reproduce_blob(failure: BaseException) -> str | None:
    """The `@reproduce_failure` line Hypothesis noted on the failure (print_blob)."""
    for text in getattr(failure, "__notes__", []):
        match = _REPRODUCE.search(text)
        if match:
            return match.group(0)
    return None
