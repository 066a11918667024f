"""Run a spec on twinstep's backends or a generated snippet over one gradient stream (the native
references, torch objects and optax's own transforms, are in conformance.port.verify.native).

The stream is exact: micro-batch j of update t has the loss L = Σ_k Σ G_tjk · θ_k (times `poison`,
inf to inject a non-finite update), so its gradient is G_tjk whatever the parameters; its element
count (for accumulation.normalize = "tokens") is `count` and its summed loss count · L. Every runner
returns a `Trace`: the parameters after each update, the lr each parameter was updated with, and
whether the update was skipped, so any two can be compared update by update (`compare`).

torch and jax are imported inside the functions that need them (twinstep's backends only through
their public `update.run_updates`); call the JAX runners inside
`conformance.harness.backends.Backend("jax").context()` for float64.
"""

from __future__ import annotations

import fnmatch
import re

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from conformance.config import Config
from conformance.errors import TwinstepError

MicroBatch = dict[str, Any]  # {"g": {name: ndarray}, "count": float, "poison": float}


class Trace(NamedTuple):
    params: list[dict[str, np.ndarray]]  # after each update
    lrs: list[dict[str, float]]  # the lr each parameter's group had for the update
    skipped: list[bool]
    scales: list[float | None]  # the loss scale in force at each update (None: no dynamic scaling)
    ema: list[dict[str, np.ndarray] | None] | None = None  # a snippet's weights' EMA after each update ([ema])


def gradient_stream(shapes: Mapping[str, Sequence[int]], updates: int, micro: int = 1, seed: int = 0,
                    scale: float = 1.0, poison: Sequence[int] = (), last: int | None = None) -> list[list[MicroBatch]]:
    """`updates` windows of `micro` micro-batches (the last one of `last` if given), Gaussian G;
    windows listed in `poison` carry an inf loss (a non-finite update)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(updates):
        size = last if (last is not None and t == updates - 1) else micro
        out.append([{"g": {k: rng.normal(size=tuple(s)) * scale for k, s in shapes.items()},
                     "count": float(rng.integers(1, 5)), "poison": np.inf if t in poison else 1.0}
                    for _ in range(size)])
    return out


def compare(got: Trace, want: Trace, atol: float = 1e-12, rtol: float = 1e-10) -> tuple[float, str | None]:
    """(max abs error over parameters, first failure message or None): parameters after every update
    (|got − want| <= atol + rtol·|want|), the lr of every parameter and the skip decisions."""
    worst = 0.0
    if len(got.params) != len(want.params):
        return np.inf, f"{len(got.params)} updates, expected {len(want.params)}"
    for t, (g, w) in enumerate(zip(got.params, want.params)):
        if got.skipped[t] != want.skipped[t]:
            return np.inf, f"update {t}: skipped = {got.skipped[t]}, expected {want.skipped[t]}"
        if got.scales and want.scales and got.scales[t] != want.scales[t]:
            return np.inf, f"update {t}: loss scale {got.scales[t]}, expected {want.scales[t]}"
        for name, lr in want.lrs[t].items():
            if not np.isclose(got.lrs[t][name], lr, rtol=rtol, atol=atol * 1e-3):
                return np.inf, f"update {t}: lr of {name!r} = {got.lrs[t][name]!r}, expected {lr!r}"
        for name, a in w.items():
            err = np.abs(np.asarray(g[name], np.float64) - a)
            worst = max(worst, float(err.max(initial=0.0)))
            if not np.all(err <= atol + rtol * np.abs(a)):
                return worst, f"update {t}: {name!r} differs by {float(err.max()):.3g}"
    return worst, None


# ------------------------------------------------------------------ twinstep's backends


def run_backend(framework: str, config: Config, params: Mapping[str, np.ndarray],
                windows: list[list[MicroBatch]], position: int = 0, updates_per_epoch: int = 1) -> Trace:
    """twinstep's `framework` backend ("torch" | "jax") over the stream: its public
    update.run_updates (the trainer's optimizer, schedule from `position` and update path)."""
    from conformance.harness.backends import Backend

    out = Backend(framework).function("update", "run_updates")(config, params, windows, position, updates_per_epoch)
    return Trace(out["params"], out["lrs"], out["skipped"], out["scales"])


# ------------------------------------------------------------------ generated snippets


def _module(params: Mapping[str, np.ndarray], dtype: Any) -> Any:
    """A torch module whose named_parameters() are `params` (dotted names become sub-modules) and
    whose output on x = (G, poison) is poison · Σ_k Σ G_k · θ_k."""
    import torch

    class Node(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            g, poison = x
            return sum((g[n] * p).sum() for n, p in self.named_parameters()) * poison

    root = Node()
    for name, value in params.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if part not in node._modules:
                node.add_module(part, Node())
            node = node._modules[part]
        node.register_parameter(leaf, torch.nn.Parameter(torch.tensor(np.asarray(value, np.float64), dtype=dtype)))
    return root


def _loss_fns(config: Config) -> tuple[Any, ...]:
    # y is the micro-batch's count: tokens sums count · L over "elements", micro_batches takes L
    if config.accumulation.normalize == "tokens":
        return (lambda out, y: out * y), (lambda y: y)
    return ((lambda out, y: out),)


def run_torch_snippet(code: str, config: Config, params: Mapping[str, np.ndarray],
                      windows: list[list[MicroBatch]]) -> Trace:
    """exec a `--to torch` snippet in a fresh namespace and run its Updater over the stream."""
    import torch

    ns: dict[str, Any] = {"__name__": "twinstep_port_snippet"}
    exec(compile(code, "<torch snippet>", "exec"), ns)  # noqa: S102 - the code under test
    dt = getattr(torch, config.precision.param_dtype)
    model = _module(params, dt)
    named = dict(model.named_parameters())
    updater = ns["Updater"](model)
    group_of = {id(p): i for i, g in enumerate(updater.optimizer.param_groups) for p in g["params"]}
    out = Trace([], [], [], [], [])
    for window in windows:
        lrs = {n: float(updater.optimizer.param_groups[group_of[id(p)]]["lr"]) for n, p in named.items()}
        out.scales.append(updater.scaler.get_scale() if updater.scaler else None)
        batch = [(({k: torch.tensor(v, dtype=dt) for k, v in mb["g"].items()}, torch.tensor(mb["poison"], dtype=dt)),
                  torch.tensor(mb["count"], dtype=dt)) for mb in window]
        metrics = updater(batch, *_loss_fns(config))
        out.params.append({k: named[k].detach().double().numpy().copy() for k in params})
        if hasattr(updater, "ema"):  # AveragedModel: its copy of the model, once it has averaged
            averaged = dict(updater.ema.module.named_parameters())
            out.ema.append({k: averaged[k].detach().double().numpy().copy() for k in params}
                           if int(updater.ema.n_averaged) else None)
        out.lrs.append(lrs)
        out.skipped.append(bool(metrics["skipped"]))
    return out


def run_optax_snippet(code: str, config: Config, params: Mapping[str, np.ndarray],
                      windows: list[list[MicroBatch]]) -> Trace:
    """exec a `--to optax` snippet in a fresh namespace and run its train step over the stream."""
    import jax.numpy as jnp

    ns: dict[str, Any] = {"__name__": "twinstep_port_snippet"}
    exec(compile(code, "<optax snippet>", "exec"), ns)  # noqa: S102 - the code under test
    dt = ns["PARAM_DTYPE"]

    def apply_fn(q: Any, x: Any) -> Any:
        g, poison = x
        return sum(jnp.sum(g[k] * q[k]) for k in q) * poison

    step = ns["make_train_step"](apply_fn, *_loss_fns(config))
    state = ns["init"](dict(params))
    index = {k: ns["group_index"](k, np.ndim(v)) for k, v in params.items()}
    out = Trace([], [], [], [])
    dynamic = config.precision.dynamic_scaling
    out = Trace([], [], [], [], [])
    for window in windows:
        out.scales.append(float(state.scale) if dynamic else None)
        batch = [(({k: jnp.asarray(v, dt) for k, v in mb["g"].items()}, jnp.asarray(mb["poison"], dt)),
                  jnp.asarray(mb["count"], dt)) for mb in window]
        state, metrics = step(state, batch)
        out.params.append({k: np.asarray(v, np.float64) for k, v in state.params.items()})
        if hasattr(state, "ema"):
            out.ema.append({k: np.asarray(v, np.float64) for k, v in state.ema.items()} if bool(state.ema_started)
                           else None)
        out.lrs.append({k: float(metrics["lr"][i]) for k, i in index.items()})
        out.skipped.append(bool(metrics["skipped"]))
    return out


def run_snippet(framework: str, code: str, config: Config, params: Mapping[str, np.ndarray],
                windows: list[list[MicroBatch]]) -> Trace:
    """run_torch_snippet or run_optax_snippet by the snippet's framework ("torch" | "optax")."""
    runner = {"torch": run_torch_snippet, "optax": run_optax_snippet}[framework]
    return runner(code, config, params, windows)


# ------------------------------------------------------------------ `twinstep port --check`


def check_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """The model's parameter names with every dimension cut to at most 4 (names for the group
    patterns, ranks for muon and adafactor); a small set of names when the model cannot be sized."""
    from conformance.rules.models import param_shapes

    try:
        shapes = param_shapes(config.model, None)  # a model whose sizes the config states
    except TwinstepError:
        try:
            from conformance.data.datasets import load_dataset

            seed = config.data.seed if config.data.seed is not None else config.run.seed
            info = load_dataset(config.data, seed, config.data.block_size or config.model.block_size).info
            shapes = param_shapes(config.model, info)
        except TwinstepError:  # no data at hand: any names do when no pattern needs a real one
            shapes = {"0.weight": (4, 3), "0.bias": (4,), "1.weight": (2, 4), "1.bias": (2,)}
    shapes = {k: tuple(min(n, 4) for n in s) for k, s in shapes.items()}
    patterns = _patterns(config)
    if any(not any(fnmatch.fnmatchcase(n, p) for n in shapes) for p in patterns):
        # the groups name the user's own model ('fc.weight', 'encoder.*'): a parameter for each of
        # their patterns, and two the patterns may leave to the default group
        shapes = {_instance(p): ((3, 4) if _instance(p).endswith("weight") else (3,)) for p in patterns}
        shapes.update({"rest_0.weight": (2, 3), "rest_0.bias": (2,)})
    return shapes


def _patterns(config: Config) -> list[str]:
    o = config.optimizer
    found = [p for g in o.groups for p in g.params] + list(o.no_weight_decay or [])
    return list(dict.fromkeys(found + list(getattr(o, "fallback_params", None) or [])))


def _instance(pattern: str) -> str:
    """A parameter name the glob matches ('encoder.*' -> 'encoder.w')."""
    name = re.sub(r"\[!?([^\]])[^\]]*\]", lambda m: m.group(1) if not m.group(0).startswith("[!") else "_", pattern)
    return name.replace("*", "w").replace("?", "x")


def float64_variant(config: Config) -> Config:
    """The same spec in float64 (dynamic loss scaling kept when the original uses it)."""
    from conformance.config import load_config

    data = config.model_dump(mode="python")
    prec = {k: v for k, v in data["precision"].items()}
    prec.update(dtype="float64", loss_scale="dynamic" if config.precision.dynamic_scaling else "none",
                allow_tf32=False)
    data["precision"] = prec
    return load_config(_no_none(data))


def _no_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_no_none(v) for v in value]
    return value


def self_check(config: Config, framework: str, code_for: Any, updates: int = 8,
               updates_per_epoch: int = 1) -> tuple[float, str | None, int]:
    """Run the snippet `code_for(float64 config)` and twinstep's backend of the same framework on a
    random gradient stream (an injected non-finite update included); (max |Δ|, failure, updates)."""
    from conformance.harness.backends import Backend

    cfg = float64_variant(config)
    shapes = check_shapes(cfg)
    rng = np.random.default_rng(0)
    params = {k: rng.normal(size=s) for k, s in shapes.items()}
    windows = gradient_stream(shapes, updates, micro=cfg.accumulation.steps, poison=[updates // 2], scale=0.5)
    backend = "torch" if framework == "torch" else "jax"
    with Backend(backend).context():
        want = run_backend(backend, cfg, params, windows, updates_per_epoch=updates_per_epoch)
        got = run_snippet(framework, code_for(cfg), cfg, params, windows)
    err, message = compare(got, want)
    return err, message, updates
