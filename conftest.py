"""pytest plugin of the harness: options, world sizing and Hypothesis profiles."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness")
    group.addoption("--nproc", type=int, default=2,
                    help="ranks in the DP world of the distributed suite (default 2)")


def pytest_configure(config: pytest.Config) -> None:
    nproc = config.getoption("--nproc")
    if nproc < 2:
        raise pytest.UsageError(f"--nproc: {nproc} ranks; a DP world needs at least 2")


@pytest.fixture(scope="session")
def nproc(request: pytest.FixtureRequest) -> int:
    return request.config.getoption("--nproc")
