"""Data parallelism over the devices of one process with jax.sharding.

A one-axis Mesh ("data") over the run's devices: parameters, optimizer state, loss scale and
counters are replicated; every batch is split along its sample axis, so each device computes its
rows of each micro-batch and XLA all-reduces the gradient sums inside the compiled step (the
gradient of a sum over the global micro-batch is the sum of the devices' parts). The global batch
is the config's: data.batch_size × accumulation.steps, whatever the device count.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from conformance.errors import ConfigError


class Placement(NamedTuple):
    """Where a run's arrays live: the mesh, the replicated sharding, and the devices."""

    mesh: Mesh
    replicated: NamedSharding
    devices: tuple[Any, ...]

    @property
    def count(self) -> int:
        return len(self.devices)

    def batch_sharding(self, ndim: int, axis: int) -> NamedSharding:
        """Split dimension `axis` (the samples) of an ndim-array over the mesh."""
        spec = [None] * ndim
        spec[axis] = "data"
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def put_replicated(self, tree: Any) -> Any:
        """A copy of every leaf on every device: leaves that shared a buffer (zeros made once)
        get their own, so the whole tree can be donated to the train step."""
        def put(x: Any) -> Any:
            if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                return jax.device_put(x, self.replicated)  # keys are read, never donated
            return jax.device_put(np.array(x), self.replicated)  # a host copy: a buffer of its own

        return jax.tree.map(put, tree)

    def put_batch(self, arrays: dict[str, Any], axis: int) -> dict[str, Any]:
        """Arrays (nested mappings too) with a sample axis at `axis` are split over the devices;
        scalars and shorter arrays (per-micro-batch flags) are replicated."""
        def put(value: np.ndarray) -> Any:
            sharded = value.ndim > axis and self.count > 1
            return jax.device_put(value, self.batch_sharding(value.ndim, axis) if sharded else self.replicated)

        return jax.tree.map(put, arrays)


def select_devices(device: str) -> tuple[Any, ...]:
    """The devices of run.device: "auto" (JAX's default backend), "cpu" or "cuda" (JAX's GPUs)."""
    if device == "cpu":
        return tuple(jax.devices("cpu"))
    if device == "cuda":
        try:
            found = tuple(jax.devices("gpu"))
        except RuntimeError:
            found = ()
        if not found:
            raise ConfigError("run.device = 'cuda' but JAX sees no GPU (install jax[cuda12] or use 'cpu')")
        return found
    return tuple(jax.devices())


def placement(device: str) -> Placement:
    """A Mesh over every device of run.device."""
    devices = select_devices(device)
    mesh = Mesh(np.asarray(devices, dtype=object), ("data",))
    return Placement(mesh, NamedSharding(mesh, PartitionSpec()), devices)
