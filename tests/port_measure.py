"""Measure how closely the ports agree (the numbers quoted in docs/porting.md).

    python tests/port_measure.py

For every native torch set-up, optax description and snippet configuration of the porting tests:
the largest |difference| of the parameters, over all updates, between the original (native torch
objects, optax's own transforms, twinstep's torch backend) and its port (twinstep's torch and JAX
backends, the generated torch and optax snippets). Prints one line per family and the worst case.
"""

from __future__ import annotations

from support.port import (
    OPTIMIZERS,
    SCHEDULERS,
    config_of,
    float64_default,
    native_run,
    on_backends,
)
from test_port_code import OPTIMIZERS as CODE_OPTIMIZERS
from test_port_code import PATHS, SCHEDULES, _config, _values
from test_port_optax import DESCRIPTIONS, SHAPES

from conformance.config import load_config
from conformance.harness.backends import Backend
from conformance.port import from_optax
from conformance.port.verify.native import run_native_optax
from conformance.port.verify.traces import (
    compare,
    gradient_stream,
    run_backend,
    run_snippet,
)
from conformance.port.write.optax_code import optax_code
from conformance.port.write.torch_code import torch_code


def from_torch_errors() -> list[tuple[str, float]]:
    out = []
    cases = [(k, "step") for k in OPTIMIZERS] + [("sgd-nesterov", s) for s in SCHEDULERS if s != "none"]
    for kind, schedule in cases:
        with float64_default():
            spec, position, values, windows, want = native_run(kind, schedule, updates=12)
        for name, trace in on_backends(config_of(spec), values, windows, position).items():
            out.append((f"from_torch {kind}/{schedule} [{name}]", compare(trace, want)[0]))
    return out


def from_optax_errors() -> list[tuple[str, float]]:
    out = []
    for key, description in DESCRIPTIONS.items():
        config = load_config({**from_optax({"optax": description}), "precision": {"dtype": "float64"}})
        values = {k: v * 0.5 for k, v in gradient_stream(SHAPES, 1, seed=9)[0][0]["g"].items()}
        windows = gradient_stream(SHAPES, 12, micro=config.accumulation.steps)
        with Backend("jax").context():
            want = run_native_optax(description, values, windows)
        for name, trace in on_backends(config, values, windows).items():
            out.append((f"from_optax {key} [{name}]", compare(trace, want)[0]))
    return out


def snippet_errors() -> list[tuple[str, float]]:
    configs = {**{f"optimizer {k}": _config(v) for k, v in CODE_OPTIMIZERS.items()},
               **{f"schedule {k}": _config({"name": "sgd", "lr": 0.1, "momentum": 0.9}, v)
                  for k, v in SCHEDULES.items() if k != "per-epoch"},
               **{f"path {k}": _config({"name": "adamw", "lr": 0.05}, clip=c, acc=a, precision=p)
                  for k, (c, a, p) in PATHS.items()}}
    out = []
    for key, config in configs.items():
        values = _values(config)
        windows = gradient_stream({k: v.shape for k, v in values.items()}, 9, micro=config.accumulation.steps,
                                  poison=(2, 5))
        with Backend("torch").context():
            want = run_backend("torch", config, values, windows)
        for framework, backend, make in (("torch", "torch", torch_code), ("optax", "jax", optax_code)):
            with Backend(backend).context():
                out.append((f"snippet {key} [{framework}]",
                            compare(run_snippet(framework, make(config), config, values, windows), want)[0]))
    return out


def main() -> None:
    worst = ("", 0.0)
    for family in (from_torch_errors, from_optax_errors, snippet_errors):
        rows = family()
        top = max(rows, key=lambda r: r[1])
        print(f"{family.__name__}: {len(rows)} runs, max |difference| {top[1]:.3g} ({top[0]})")
        worst = max(worst, top, key=lambda r: r[1])
    print(f"worst: {worst[1]:.3g} ({worst[0]})")


if __name__ == "__main__":
    main()
