"""Schedule-free optimizers (schedulefree's AdamWScheduleFree / SGDScheduleFree): the package's names
and defaults, and the switch between the training point y and the evaluation point x, exact both
ways on both frameworks (the trajectories themselves: tests/test_optimizers.py, the cases
conformance/cases/optimizer/schedulefree-*; the divergences from the package and optax:
tests/test_optimizers_divergences_peers.py)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from support.optimizers import run_all, spec_of

from conformance.config.optimizer import SCHEDULE_FREE


@pytest.mark.parametrize(("name", "cls"), [("schedule_free_adamw", "AdamWScheduleFree"),
                                           ("schedule_free_sgd", "SGDScheduleFree")])
def test_defaults_are_the_packages(name: str, cls: str) -> None:
    schedulefree = pytest.importorskip("schedulefree")
    signature = inspect.signature(getattr(schedulefree, cls)).parameters
    spec = spec_of({"name": name}).overrides()
    assert set(spec) == set(signature) - {"params", "foreach"}
    for key, value in spec.items():
        assert value == signature[key].default, f"{name}.{key}: spec {value!r}, schedulefree {signature[key].default!r}"


def _trained(framework, name: str):
    """(optimizer state, params, oracle states) after 4 updates of `name` on w (2, 3) and b (3,)."""
    rng = np.random.default_rng(4)
    params = {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(4)]
    spec = spec_of({"name": name, "lr": 0.1, "warmup_steps": 2, "weight_decay": 0.05})
    oracle = run_all(spec, params, grads, backends=("oracle",))["oracle"]
    opt = framework.function("optimizers", "run_trajectory")  # the public path; states below are exported
    out = opt(spec, params, grads)
    return spec, params, grads, out, oracle


@pytest.mark.parametrize("name", SCHEDULE_FREE)
def test_eval_point_is_x_and_train_point_is_y_bit_for_bit(name: str, framework) -> None:
    """to_eval_point gives the state's x; to_train_point gives back exactly the y the update made."""
    spec, params, grads, out, oracle = _trained(framework, name)
    np.testing.assert_allclose(out["state"][-1]["w"]["x"], oracle["state"][-1]["w"]["x"], rtol=1e-12)
    if framework.name == "torch":
        import torch

        from ref_torch import optimizers as opt

        named = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
        state = opt.build_optimizer(spec, named.items())
        for g in grads:
            for k, p in named.items():
                p.grad = torch.tensor(g[k])
            state.step()
        y = {k: p.detach().clone() for k, p in named.items()}
        opt.to_eval_point(state, named)
        x = {k: p.detach().numpy().copy() for k, p in named.items()}
        opt.to_train_point(state, named)
        back = {k: p.detach() for k, p in named.items()}
        assert all(torch.equal(back[k], y[k]) for k in y)
    else:
        import jax.numpy as jnp

        from ref_jax import optimizers as opt

        p = {k: jnp.asarray(v) for k, v in params.items()}
        tx = opt.build_optimizer(spec, p)
        state = tx.init(p)
        for g in grads:
            u, state = tx.update({k: jnp.asarray(v) for k, v in g.items()}, state, p)
            p = {k: p[k] + u[k] for k in p}
        xs = opt.to_eval_point(state, p)
        x = {k: np.asarray(v) for k, v in xs.items()}
        back = opt.to_train_point(state, xs)
        assert all(np.array_equal(np.asarray(back[k]), np.asarray(p[k])) for k in p)
    np.testing.assert_array_equal(x["w"], opt.export_state(state)["state"]["w"]["x"])  # x itself, exactly
    np.testing.assert_allclose(out["params"][-1]["w"], oracle["params"][-1]["w"], rtol=1e-12)


def test_other_optimizers_have_one_point(framework) -> None:
    spec = spec_of({"name": "adamw", "lr": 0.1})
    params = {"w": np.ones(3)}
    if framework.name == "torch":
        import torch

        from ref_torch import optimizers as opt

        named = {"w": torch.nn.Parameter(torch.ones(3, dtype=torch.float64))}
        state = opt.build_optimizer(spec, named.items())
        assert opt.to_eval_point(state, named) is named and opt.to_train_point(state, named) is named
    else:
        import jax.numpy as jnp

        from ref_jax import optimizers as opt

        p = {"w": jnp.ones(3)}
        state = opt.build_optimizer(spec, p).init(p)
        assert np.array_equal(np.asarray(opt.to_eval_point(state, p)["w"]), params["w"])
