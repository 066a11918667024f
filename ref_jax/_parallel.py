"""Data parallelism for the trainer: the processes of a torchrun launch joined (`setup`) and left
(`teardown`), and how gradients, counts, losses and checkpoint bytes meet across them.

One process per rank under torchrun; gloo carries the CPU's collectives. The global batch is the
world size (processes) × data.batch_size × accumulation.steps, whatever each process's device
count. ref_torch uses torch.distributed (DDP, or FSDP2's shards; NCCL on CUDA, one device per
process); ref_jax one jax.sharding Mesh over every process's devices, where XLA all-reduces the
gradient sums inside the compiled step.
"""

# The JAX side: data parallelism over the devices of one process with jax.sharding.
#
# A one-axis Mesh ("data") over the run's devices: parameters, optimizer state, loss scale and
# counters are replicated; every batch is split along its sample axis, so each device computes its
# rows of each micro-batch and XLA all-reduces the gradient sums inside the compiled step (the
# gradient of a sum over the global micro-batch is the sum of the devices' parts). The global batch
# is the config's: data.batch_size × accumulation.steps, whatever the device count.
#
# Across processes (`torchrun --nproc_per_node N -m conformance train CONFIG --backend jax`; torchrun
# only launches: `setup` calls jax.distributed.initialize from its RANK / WORLD_SIZE /
# MASTER_ADDR, the coordinator on MASTER_PORT + 1, since torchrun's own store holds MASTER_PORT; set
# TWINSTEP_JAX_COORDINATOR=host:port to choose), the mesh spans every process's devices and the
# global batch is the torch trainer's: world size × data.batch_size × accumulation.steps. Each process
# lays out its own part of every micro-batch (the pipeline's rank part) at `rows_for(batch_size,
# local devices)` rows, and `put_batch` joins the parts into one global array
# (jax.make_array_from_process_local_data); CPU collectives are gloo's
# (jax_cpu_collectives_implementation). `gather_bytes` all-gathers bytes between processes (checkpoint
# tables, RNG states, the preemption flag).

from __future__ import annotations

import os
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

    @property
    def local_count(self) -> int:
        """This process's devices (all of them in one process)."""
        return sum(d.process_index == jax.process_index() for d in self.devices)

    @property
    def processes(self) -> int:
        return len({d.process_index for d in self.devices})

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
                if self.processes > 1:
                    raw = jax.make_array_from_process_local_data(self.replicated,
                                                                 np.asarray(jax.random.key_data(x)))
                    return jax.random.wrap_key_data(raw, impl=jax.random.key_impl(x))
                return jax.device_put(x, self.replicated)  # keys are read, never donated
            if self.processes > 1:
                return jax.make_array_from_process_local_data(self.replicated, np.array(x))
            return jax.device_put(np.array(x), self.replicated)  # a host copy: a buffer of its own

        return jax.tree.map(put, tree)

    def put_batch(self, arrays: dict[str, Any], axis: int) -> dict[str, Any]:
        """Arrays (nested mappings too) with a sample axis at `axis` are split over the devices;
        scalars and shorter arrays (per-micro-batch flags) are replicated."""
        def put(value: np.ndarray) -> Any:
            sharded = value.ndim > axis and self.count > 1
            sharding = self.batch_sharding(value.ndim, axis) if sharded else self.replicated
            if self.processes > 1:  # this process's rows of the global array (replicated: the whole value)
                return jax.make_array_from_process_local_data(sharding, value)
            return jax.device_put(value, sharding)

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


def setup(rank: int, world_size: int, device: str = "auto") -> bool:
    """Join the processes of a torchrun launch (True when this call joined them and must call
    teardown); one process, or a group already joined: nothing to do."""
    # With run.device = "cuda" each process takes the GPU of its LOCAL_RANK (as the torch trainer
    # does); on the CPU each process has its CPU device. Must run before anything touches a JAX device.
    if world_size == 1 or jax.distributed.is_initialized():
        return False
    env = os.environ
    address = env.get("TWINSTEP_JAX_COORDINATOR")
    if address is None:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise ConfigError(f"world_size = {world_size} needs a launcher: {missing[0]} is not set (start with "
                              f"torchrun --nproc_per_node {world_size} -m conformance train ... --backend jax)")
        address = f"{env['MASTER_ADDR']}:{int(env['MASTER_PORT']) + 1}"
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    local = env.get("LOCAL_RANK")
    jax.distributed.initialize(address, num_processes=world_size, process_id=rank,
                               local_device_ids=[int(local)] if local is not None and device == "cuda" else None)
    return True


def teardown(created: bool) -> None:
    """Leave the processes this run joined (`created`: setup's answer), leaving nothing behind that
    keeps them alive past the run."""
    if created and jax.distributed.is_initialized():
        jax.distributed.shutdown()


def gather_bytes(data: bytes) -> list[bytes]:
    """Every process's bytes, in rank order, on every process (one process: [data])."""
    if jax.process_count() == 1:
        return [data]
    from jax.experimental import multihost_utils

    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([len(data)], np.int64))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:len(data)] = np.frombuffer(data, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), -1)
    return [rows[i, :int(n)].tobytes() for i, n in enumerate(sizes)]


def host_array(x: Any) -> np.ndarray:
    """A replicated array's value on the host, also when the mesh spans processes."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.array(x.addressable_data(0))
    return np.array(jax.device_get(x))
