"""A user's own models and data for the issue-14 tests: small networks twinstep does not ship,
written in torch and in Flax NNX, synthetic arrays, and a script entry that trains them through
`train(config, out, model=..., data=...)` (for the kill tests and torchrun):

    python tests/support/user_models.py torch OUT [--resume] [--kind bn|plain|bn-plain] [--loss-fn]
                                        [--set section.key=VALUE ...] [--fault NAME key=value ...]

Kinds: "bn" is Linear → BatchNorm → ReLU → Dropout → Linear (buffers / NNX BatchStat and RNG state
to checkpoint; torch draws dropout from its global generator, NNX from the module's nnx.Rngs);
"plain" is Linear → tanh → Linear (no state: what data-parallel equality needs); "bn-plain" is
"bn" without its Dropout (the statistics are the only thing that differs across processes) and
without the first Linear's bias (before BatchNorm its gradient is 0 in exact arithmetic, so AdamW
would step it by rounding noise over eps, which no two summation orders share). `--fault` exits the
process with status 137 at that run event (tests/support/faults.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FEATURES, CLASSES, HIDDEN = 8, 3, 16


def blobs(n: int = 480, seed: int = 0, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """A learnable 3-class problem: y = argmax(x @ W) for a fixed W, x ~ N(0, 1)^8."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, FEATURES))
    w = np.random.default_rng(1234).standard_normal((FEATURES, CLASSES))
    return {"x": x.astype(dtype), "y": np.argmax(x @ w, axis=1).astype(np.int64)}


def torch_model(kind: str = "bn", seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)  # the user's own initialization, the same in every process
    if kind == "plain":
        return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(FEATURES, HIDDEN)
            self.bn = nn.BatchNorm1d(HIDDEN)
            self.drop = nn.Dropout(0.1)
            self.fc2 = nn.Linear(HIDDEN, CLASSES)

        def forward(self, x: Any) -> Any:
            return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))

    if kind == "bn-plain":
        net = Net()
        net.drop = nn.Identity()
        net.fc1 = nn.Linear(FEATURES, HIDDEN, bias=False)
        return net

    return Net()


def nnx_model(kind: str = "bn", seed: int = 0) -> Any:
    import jax
    from flax import nnx

    rngs = nnx.Rngs(seed)
    if kind == "plain":
        class Plain(nnx.Module):
            def __init__(self) -> None:
                self.fc1 = nnx.Linear(FEATURES, HIDDEN, rngs=rngs)
                self.fc2 = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

            def __call__(self, x: Any) -> Any:
                return self.fc2(jax.numpy.tanh(self.fc1(x)))

        return Plain()

    class Net(nnx.Module):
        def __init__(self) -> None:
            self.fc1 = nnx.Linear(FEATURES, HIDDEN, use_bias=kind != "bn-plain", rngs=rngs)
            self.bn = nnx.BatchNorm(HIDDEN, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.fc2 = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            h = jax.nn.relu(self.bn(self.fc1(x)))
            return self.fc2(h if kind == "bn-plain" else self.drop(h))

    return Net()


def model(framework: str, kind: str = "bn", seed: int = 0) -> Any:
    return torch_model(kind, seed) if framework == "torch" else nnx_model(kind, seed)


def cross_entropy_sum(framework: str) -> Any:
    """A user's loss_fn: (summed cross-entropy, number of samples), masking padding rows."""
    if framework == "torch":
        import torch.nn.functional as F

        def torch_loss(out: Any, batch: Any) -> Any:
            return F.cross_entropy(out, batch["y"], reduction="sum"), batch["y"].shape[0]

        return torch_loss
    import jax
    import jax.numpy as jnp

    def jax_loss(out: Any, batch: Any) -> Any:
        logp = jax.nn.log_softmax(out, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["y"][:, None], axis=-1)[:, 0]
        mask = batch["sample_mask"]
        return jnp.sum(jnp.where(mask, nll, 0.0)), jnp.sum(mask)

    return jax_loss


def config(updates: int = 30) -> dict[str, Any]:
    """The resume run: AdamW, warm-up + cosine, clipping, token-normalized accumulation of 2,
    dynamic loss scaling with injected overflows, a checkpoint every 4 updates with retention,
    evaluations (BatchNorm's running statistics show in val_loss)."""
    return {
        "data": {"batch_size": 24, "val_fraction": 0.2},
        "optimizer": {"name": "adamw", "lr": 5e-3},
        "schedule": {"name": "warmup_cosine", "warmup_steps": 4, "total_steps": updates, "eta_min": 1e-4},
        "clip": {"max_norm": 1.0},
        "accumulation": {"steps": 2, "normalize": "tokens"},
        "precision": {"loss_scale": "dynamic", "init_scale": 1024.0, "growth_interval": 3},
        "run": {"max_updates": updates, "eval_every": 5, "device": "cpu", "inject_nonfinite": [3, 11]},
        "checkpoint": {"every": 4, "keep_last": 2},
    }


def main(argv: list[str]) -> int:
    import importlib

    from conformance.config import load_config

    framework, out = argv[0], argv[1]
    rest = argv[2:]
    fault = None
    if "--fault" in rest:
        at = rest.index("--fault")
        fault, rest = rest[at + 1:], rest[:at]
    opts: dict[str, Any] = {"kind": "bn", "set": []}
    i = 0
    while i < len(rest):
        if rest[i] in ("--kind", "--set"):
            opts["set"].append(rest[i + 1]) if rest[i] == "--set" else opts.update(kind=rest[i + 1])
            i += 2
        else:
            i += 1
    events = None
    if fault:
        from support.faults import die_at

        events = die_at(fault[0], **dict(p.split("=", 1) for p in fault[1:]))
    cfg = load_config(config(), opts["set"])
    dtype = np.float64 if cfg.precision.dtype == "float64" else np.float32
    train = importlib.import_module(f"ref_{framework}.trainer").train
    loss_fn = cross_entropy_sum(framework) if "--loss-fn" in rest else None
    train(cfg, out, model=model(framework, opts["kind"]), data=blobs(dtype=dtype), loss_fn=loss_fn,
          resume="--resume" in rest, progress="none", events=events)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main(sys.argv[1:]))
