"""Data parallelism over devices (jax.sharding): the JAX trainer on two devices equals one device at
the same global batch.

XLA_FLAGS=--xla_force_host_platform_device_count=2 must be set before JAX initialises, so every
run here is a subprocess: `python -m conformance train --backend jax` with and without the flag.
The micro-batch of 31 samples (240 training samples: 8 per epoch, the last of 23) does not split
evenly: it is padded to 32 rows (16 per device) with a mask; windows end incomplete and the last
micro-batch of an epoch is short. float64, so the two-device run must agree to 1e-10 (measured
~2e-16: only the order of the cross-device sums differs). A second check looks inside: the placed
batch really is split over the two devices.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import checkpoint as ck
from conformance.run.compare import compare_runs, describe_failure

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """
[model]
name = "mlp"
hidden = [16]
[data]
name = "binary_blobs"
n_samples = 300
batch_size = 31
eval_batch_size = 25
[optimizer]
name = "adamw"
lr = 1e-2
[schedule]
name = "cosine"
t_max = 12
[clip]
max_norm = 0.5
[accumulation]
steps = 3
normalize = "{normalize}"
[precision]
dtype = "float64"
[run]
epochs = 2
eval_every = 3
device = "cpu"
"""


def env(devices: int) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "XLA_FLAGS"))}
    e["PYTHONPATH"] = str(ROOT)
    if devices > 1:
        e["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return e


def train(tmp: Path, name: str, devices: int, normalize: str) -> Path:
    config = tmp / "run.toml"
    config.write_text(CONFIG.format(normalize=normalize))
    out = tmp / name
    proc = subprocess.run([sys.executable, "-m", "conformance", "train", str(config), "--backend", "jax", "--out",
                           str(out), "--progress", "none"], env=env(devices), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.parametrize("normalize", ["tokens", "micro_batches"])
def test_two_devices_equal_one(tmp_path: Path, normalize: str) -> None:
    one, two = train(tmp_path, "one", 1, normalize), train(tmp_path, "two", 2, normalize)
    manifests = [ck.load_checkpoint(ck.list_checkpoints(d / "checkpoints")[-1][1]).manifest for d in (one, two)]
    assert [len(m["versions"]["jax_devices"].split(",")) for m in manifests] == [1, 2]  # the mesh's devices
    result = compare_runs(one, two)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    assert len(result.rows) == 6 and len(result.evals) == 2  # windows (3, 3, 2) of 240 samples, two epochs


SHARDING_PROBE = """
import numpy as np, jax
from conformance.config import load_config
from conformance.data import DataPipeline
from conformance.run.batches import window_counts
from ref_jax._parallel import placement
from ref_jax._window import WindowLayout, rows_for
cfg = load_config({"data": {"name": "binary_blobs", "n_samples": 300, "batch_size": 31}, "accumulation": {"steps": 3}})
data = DataPipeline(cfg)
place = placement("cpu")
layout = WindowLayout(3, rows_for(31, place.count), np.float32, np.int32, np.float32)
w = data.window(0)
arrays = place.put_batch(layout.pad(w, window_counts(cfg, w)), axis=1)
x = arrays["x"]
shards = x.addressable_shards
print(place.count, x.shape, sorted({s.data.shape for s in shards}), len({s.device for s in shards}),
      arrays["present"].sharding.is_fully_replicated)
"""


def test_the_batch_is_split_over_the_devices() -> None:
    proc = subprocess.run([sys.executable, "-c", SHARDING_PROBE], env=env(2), capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0] == "2 (3, 32, 20) [(3, 16, 20)] 2 True"
