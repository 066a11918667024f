"""Shared test fixtures: backends, hypothesis profiles, the JAX numerics context."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from conformance.harness.backends import Backend

pytest_plugins = ["support.trainers"]  # the `trainer` and `one_thread` fixtures

# Profiles: "ci" keeps the whole suite fast on 2 cores; "dev" digs deeper; "long" for nightly runs.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("long", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

MAX_WORKERS = 4  # each worker holds torch and JAX (~1 GB); some tests start four processes of their own


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per CPU this process may use, at most MAX_WORKERS."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


BACKEND_NAMES = ("torch", "jax", "oracle")
FRAMEWORKS = ("torch", "jax")


@pytest.fixture(params=BACKEND_NAMES)
def backend(request: pytest.FixtureRequest):
    """Each backend, entered into its numerics context (JAX: 64-bit types on)."""
    b = Backend(request.param)
    with b.context():
        yield b


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest):
    """The two framework backends (no oracle), entered into their numerics context."""
    b = Backend(request.param)
    with b.context():
        yield b
