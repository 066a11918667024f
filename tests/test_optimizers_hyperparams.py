"""Hyper-parameters set from outside between updates, as schedules and OneCycle do: torch's
param_groups entries and JAX state arrays (jitted, never recompiled), checked against the oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.optimizers import spec_of

from conformance.errors import ConfigError
from conformance.oracle import optimizers as oracle
from conformance.rules.groups import resolve_groups
from ref_jax import optimizers as jo
from ref_torch import optimizers as to


@pytest.mark.parametrize(("name", "cycled"), [("sgd", "momentum"), ("adam", "betas"), ("rmsprop", "momentum"),
                                              ("nadam", "betas"), ("muon", "momentum")])
def test_per_update_hyperparameters(name: str, cycled: str) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    from ref_jax.backend import context

    spec = spec_of({"name": name, "momentum": 0.9} if name in ("sgd", "rmsprop") else {"name": name})
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((3, 2))
    lrs = [0.1, 0.05, 0.2, 0.01]
    moms = [0.95, 0.9, 0.85, 0.9]
    grads = [rng.standard_normal((3, 2)) for _ in lrs]

    def values(k: int) -> dict:
        hp = {"lr": lrs[k]}
        hp[cycled] = (moms[k], 0.999) if cycled == "betas" else moms[k]
        return hp

    tw = torch.nn.Parameter(torch.tensor(w0))
    opt = to.build_optimizer(spec, [("w", tw)])
    ow = {"w": w0.copy()}
    groups = resolve_groups(spec, {"w": (3, 2)})
    ostate: dict = {}
    traces = []
    with context():
        tx = jo.build_optimizer(spec, {"w": jnp.asarray(w0)})

        @jax.jit
        def step(p, g, s, lr, mom):
            traces.append(1)
            s = jo.set_group_hyperparams(s, 0, lr=lr, **{cycled: (mom, 0.999) if cycled == "betas" else mom})
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        jp, js = {"w": jnp.asarray(w0)}, tx.init({"w": jnp.asarray(w0)})
        for k, g in enumerate(grads):
            to.set_group_hyperparams(opt, 0, **values(k))
            tw.grad = torch.tensor(g)
            opt.step()
            jp, js = step(jp, {"w": jnp.asarray(g)}, js, lrs[k], moms[k])
            hp = {**groups[0].hyperparams, **values(k)}
            st0 = ostate.get("w") or oracle.init_state(groups[0].optimizer, hp, ow["w"])
            ow["w"], ostate["w"] = oracle.update(groups[0].optimizer, hp, ow["w"], g, st0)
        assert len(traces) == 1  # new values every update, one compilation
        assert jo.group_hyperparams(js)[0]["lr"] == pytest.approx(lrs[-1])
    assert to.group_hyperparams(opt)[0]["lr"] == lrs[-1]
    np.testing.assert_allclose(tw.detach().numpy(), ow["w"], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(jp["w"]), ow["w"], rtol=1e-12, atol=1e-14)


def test_setting_an_unknown_hyperparameter_is_an_error(framework) -> None:
    spec = spec_of({"name": "adam"})
    mod = framework.module("optimizers")
    if framework.name == "torch":
        state = mod.build_optimizer(spec, [("w", torch.nn.Parameter(torch.zeros(2)))])
    else:
        import jax.numpy as jnp

        state = mod.build_optimizer(spec, {"w": jnp.zeros(2)}).init({"w": jnp.zeros(2)})
    with pytest.raises(ConfigError, match="group 0 .* has no settable hyper-parameter 'momentum'"):
        mod.set_group_hyperparams(state, 0, momentum=0.9)
    with pytest.raises(ConfigError, match="group 3 does not exist"):
        mod.set_group_hyperparams(state, 3, lr=0.1)




def test_momentum_switched_on_after_update_0_as_onecycle_does() -> None:
    """SGD built with momentum 0 whose momentum is set before the first update (OneCycleLR does it at
    construction) and changed later: torch, JAX (jitted) and the oracle agree; torch's RMSprop
    cannot start a buffer once a parameter was updated without one (ConfigError, not a KeyError)."""
    import jax
    import jax.numpy as jnp
    import optax

    from ref_jax.backend import context

    spec = spec_of({"name": "sgd", "lr": 0.1, "dampening": 0.2})
    rng = np.random.default_rng(4)
    w0, grads = rng.standard_normal(3), [rng.standard_normal(3) for _ in range(4)]
    moms = [0.0, 0.9, 0.0, 0.5]
    tw = torch.nn.Parameter(torch.tensor(w0))
    opt = to.build_optimizer(spec, [("w", tw)])
    hp0 = dict(resolve_groups(spec, {"w": (3,)})[0].hyperparams)
    ow, ostate = w0.copy(), None
    with context():
        tx = jo.build_optimizer(spec, {"w": jnp.asarray(w0)})

        @jax.jit
        def step(p, g, s, mom):
            u, s = tx.update(g, jo.set_group_hyperparams(s, 0, momentum=mom), p)
            return optax.apply_updates(p, u), s

        jp, js = {"w": jnp.asarray(w0)}, tx.init({"w": jnp.asarray(w0)})
        for g, mom in zip(grads, moms):
            to.set_group_hyperparams(opt, 0, momentum=mom)
            tw.grad = torch.tensor(g)
            opt.step()
            jp, js = step(jp, {"w": jnp.asarray(g)}, js, mom)
            hp = {**hp0, "momentum": mom}
            ow, ostate = oracle.update("sgd", hp, ow, g, ostate or oracle.init_state("sgd", hp, ow))
    np.testing.assert_allclose(tw.detach().numpy(), ow, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(jp["w"]), ow, rtol=1e-13)
    rms = to.build_optimizer(spec_of({"name": "rmsprop"}), [("w", tw)])
    tw.grad = torch.ones(3, dtype=torch.float64)
    rms.step()
    with pytest.raises(ConfigError, match="keep no momentum buffer"):
        to.set_group_hyperparams(rms, 0, momentum=0.9)
    with context():  # the JAX twin refuses the same switch with the same error
        jtx = jo.build_optimizer(spec_of({"name": "rmsprop"}), {"w": jnp.zeros(3)})
        js = jtx.init({"w": jnp.zeros(3)})
        jo.set_group_hyperparams(js, 0, momentum=0.9)  # before the first update: allowed
        _, js = jtx.update({"w": jnp.ones(3)}, js, {"w": jnp.zeros(3)})
        with pytest.raises(ConfigError, match="keep no momentum buffer"):
            jo.set_group_hyperparams(js, 0, momentum=0.9)


@pytest.mark.parametrize(("name", "key", "values"), [
    ("sgd", "weight_decay", [0.0, 0.0, 0.1, 0.3]), ("adamw", "weight_decay", [0.0, 0.2, 0.2, 0.0]),
    ("rmsprop", "momentum", [0.9, 0.9, 0.5, 0.0]), ("sgd", "momentum", [0.0, 0.0, 0.9, 0.9]),
])
@pytest.mark.parametrize("jitted", [False, True])
def test_what_a_group_was_built_without_is_switched_on(name: str, key: str, values: list, jitted: bool) -> None:
    """The JAX twin decides at build time what a group with weight_decay = 0 or momentum = 0 needs (no
    decay work, no momentum buffer: optax.rmsprop's cost); a value set later rebuilds the group's plan,
    concrete or traced, and the trajectory is torch's."""
    import jax
    import jax.numpy as jnp
    import optax

    from ref_jax.backend import context

    spec = spec_of({"name": name, "lr": 0.05, key: 0.0})
    rng = np.random.default_rng(9)
    w0, grads = rng.standard_normal(4), [rng.standard_normal(4) for _ in values]
    tw = torch.nn.Parameter(torch.tensor(w0))
    opt = to.build_optimizer(spec, [("w", tw)])
    with context():
        tx = jo.build_optimizer(spec, {"w": jnp.asarray(w0)})

        def step(p, g, s, value):
            u, s = tx.update(g, jo.set_group_hyperparams(s, 0, **{key: value}), p)
            return optax.apply_updates(p, u), s

        step = jax.jit(step) if jitted else step
        jp, js = {"w": jnp.asarray(w0)}, tx.init({"w": jnp.asarray(w0)})
        for g, value in zip(grads, values):
            to.set_group_hyperparams(opt, 0, **{key: value})
            tw.grad = torch.tensor(g)
            opt.step()
            jp, js = step(jp, {"w": jnp.asarray(g)}, js, value)
        np.testing.assert_allclose(np.asarray(jp["w"]), tw.detach().numpy(), rtol=1e-13, atol=1e-15)
        assert set(jo.export_state(js)["state"]["w"]) == set(to.export_state(opt)["state"]["w"])
