"""Schedule-free optimizers (schedulefree's AdamWScheduleFree / SGDScheduleFree): the package's names
and defaults, and the switch between the training point y and the evaluation point x on both
frameworks (the trajectories themselves: tests/test_optimizers.py, the cases
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


def _points(framework, name: str) -> tuple[dict, dict, dict, dict]:
    """(y, x, y after the round trip, oracle) after 4 updates of `name` on w (2, 3) and b (3,)."""
    rng = np.random.default_rng(4)
    params = {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(4)]
    spec = spec_of({"name": name, "lr": 0.1, "warmup_steps": 2, "weight_decay": 0.05})
    oracle = run_all(spec, params, grads, backends=("oracle",))["oracle"]
    if framework.name == "torch":
        import torch

        from ref_torch import optimizers as opt

        named = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
        state = opt.build_optimizer(spec, named.items())
        for g in grads:
            for k, p in named.items():
                p.grad = torch.tensor(g[k])
            state.step()
        y = {k: p.detach().numpy().copy() for k, p in named.items()}
        opt.to_eval_point(state, named)
        opt.to_eval_point(state, named)  # once: the optimizer remembers it is at x
        x = {k: p.detach().numpy().copy() for k, p in named.items()}
        opt.to_train_point(state, named)
        back = {k: p.detach().numpy().copy() for k, p in named.items()}
    else:
        import jax.numpy as jnp

        from ref_jax import optimizers as opt

        p = {k: jnp.asarray(v) for k, v in params.items()}
        tx = opt.build_optimizer(spec, p)
        state = tx.init(p)
        for g in grads:
            u, state = tx.update({k: jnp.asarray(v) for k, v in g.items()}, state, p)
            p = {k: p[k] + u[k] for k in p}
        y = {k: np.asarray(v) for k, v in p.items()}
        xs = opt.to_eval_point(state, p)
        x = {k: np.asarray(v) for k, v in xs.items()}
        back = {k: np.asarray(v) for k, v in opt.to_train_point(state, xs).items()}
    return y, x, back, oracle


@pytest.mark.parametrize("name", SCHEDULE_FREE)
def test_eval_point_is_x_and_train_point_comes_back_to_y(name: str, framework) -> None:
    """to_eval_point gives x = (y − (1−β)·z)/β (lerp(y, z, 1 − 1/β), the package's eval()) and
    to_train_point comes back to y up to the rounding of the package's own round trip."""
    from conformance.oracle.optimizers import eval_point
    from conformance.rules.groups import resolve_groups

    y, x, back, oracle = _points(framework, name)
    hp = resolve_groups(spec_of({"name": name, "lr": 0.1}), {"w": (2, 3)})[0].hyperparams
    for k in y:
        want_x = eval_point(name, hp, oracle["params"][-1][k], oracle["state"][-1][k])
        np.testing.assert_allclose(y[k], oracle["params"][-1][k], rtol=1e-12)
        np.testing.assert_allclose(x[k], want_x, rtol=1e-12)
        np.testing.assert_allclose(back[k], y[k], rtol=1e-14, atol=1e-15)
        assert not np.allclose(x[k], y[k], rtol=1e-6)


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
