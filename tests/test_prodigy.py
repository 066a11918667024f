"""Prodigy (`prodigy`, prodigyopt 1.1.2's semantics): the spec's fields and refusals, one d shared
by every parameter on both twins and the oracle (a gradient-free update, groups whose lr is 0, a
parameter without a gradient), no host read inside torch's step, and negative controls: mutants of
the oracle that the bundled prodigyopt cases must catch (tests/test_cases.py runs the cases on
every backend)."""

from __future__ import annotations

import math
import tomllib
from unittest import mock

import numpy as np
import pytest
import torch

from conformance.config import load_config
from conformance.errors import ConfigError
from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case
from conformance.oracle import optimizers as oracle
from conformance.oracle import prodigy
from conformance.rules.groups import resolve_groups
from conformance.rules.schedules import check_schedule
from support.optimizers import run_all, spec_of, worst

CASES = {c.id: c for c in load_cases(only=["optimizer/prodigyopt-*"])}
SHAPES = {"enc.weight": (3, 2), "enc.bias": (2,), "head.weight": (2, 2)}


def test_the_bundled_suite_has_prodigyopt_cases_for_each_option() -> None:
    specs = [c.sections["optimizer"] for c in CASES.values()]
    assert len(specs) >= 5 and all(s.name == "prodigy" for s in specs)
    assert any(s.use_bias_correction for s in specs) and any(s.safeguard_warmup for s in specs)
    assert any(not s.decouple and s.weight_decay for s in specs) and any(s.betas[0] == 0 for s in specs)
    assert any(math.isfinite(s.growth_rate) for s in specs) and any(g.lr == 0 for s in specs for g in s.groups)


def test_defaults_are_prodigyopt_s() -> None:
    spec = spec_of({"name": "prodigy"})
    assert spec.overrides() == {"lr": 1.0, "betas": (0.9, 0.999), "beta3": math.sqrt(0.999), "eps": 1e-8,
                                "weight_decay": 0.0, "decouple": True, "use_bias_correction": False,
                                "safeguard_warmup": False, "d0": 1e-6, "d_coef": 1.0, "growth_rate": math.inf}
    assert spec_of({"name": "prodigy", "betas": [0.9, 0.99]}).beta3 == math.sqrt(0.99)  # prodigyopt's beta3 = None
    assert spec_of({"name": "prodigy", "betas": [0.9, 0.99], "beta3": 0.5}).beta3 == 0.5


@pytest.mark.parametrize(("optimizer", "message"), [
    ({"name": "prodigy", "groups": [{"params": ["*"], "lr": 0.5}]},
     "optimizer.groups[0].lr must equal optimizer.lr = 1.0 or be 0 for prodigy"),
    ({"name": "prodigy", "groups": [{"params": ["*"], "betas": [0.5, 0.9]}]},
     "optimizer.groups[0].betas cannot differ between prodigy's groups"),
    ({"name": "prodigy", "groups": [{"params": ["*"], "d0": 0.1}]}, "optimizer.groups[0].d0 cannot differ"),
    ({"name": "prodigy", "growth_rate": 0.5}, "optimizer.growth_rate must be >= 1 or inf"),
    ({"name": "prodigy", "d0": 0.0}, "optimizer.d0 must be > 0"),
    ({"name": "prodigy", "eps": 0.0}, "optimizer.eps must be > 0 for prodigy"),
    ({"name": "prodigy", "maximize": True}, "optimizer.maximize is only used when name is"),
    ({"name": "prodigy", "cautious_weight_decay": True}, "optimizer.cautious_weight_decay is only used when name is"),
    ({"name": "adam", "d_coef": 2.0}, "optimizer.d_coef is only used when name is prodigy"),
    ({"name": "muon", "fallback": {"name": "prodigy"}}, "optimizer.fallback.name must not be prodigy"),
])
def test_bad_fields_are_one_line_config_errors(optimizer: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"optimizer": optimizer})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_group_may_set_its_lr_to_0_its_decay_and_eps() -> None:
    spec = spec_of({"name": "prodigy", "lr": 0.5, "groups": [{"params": ["a"], "lr": 0.0, "weight_decay": 0.1,
                                                              "eps": 1e-6}, {"params": ["b"], "lr": 0.5}]})
    assert [g.lr for g in spec.groups] == [0.0, 0.5]


@pytest.mark.parametrize("schedule", [
    {"name": "cosine", "t_max": 10, "hyper": {"weight_decay": {"name": "cosine", "t_max": 10}}},
    {"name": "onecycle", "max_lr": 1.0, "total_steps": 10},
])
def test_scheduling_anything_but_the_lr_is_refused(schedule: dict) -> None:
    config = load_config({"optimizer": {"name": "prodigy", "weight_decay": 0.1}, "schedule": schedule})
    with pytest.raises(ConfigError, match=r"^schedule\.(hyper\.weight_decay|cycle_momentum) .*'prodigy'"):
        check_schedule(config.schedule, config.optimizer, 10)


def _stream(rng: np.random.Generator, n: int) -> list[dict]:
    # a steady pull plus noise: the iterates leave p0 along the gradients' mean, so d grows
    grads = [{k: 1.0 + 0.5 * rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(n)]
    grads[0] = {k: np.zeros(s) for k, s in SHAPES.items()}  # Σ|s| = 0: prodigyopt returns early
    del grads[2]["enc.bias"]  # no gradient: not updated, its state kept (the shared d moves with the others)
    grads[4] = {}  # no gradient at all
    return grads


@pytest.mark.parametrize("table", [
    {"name": "prodigy", "d0": 1e-3, "weight_decay": 0.1, "use_bias_correction": True},
    {"name": "prodigy", "d0": 1e-2, "weight_decay": 0.1, "decouple": False, "safeguard_warmup": True,
     "growth_rate": 1.1, "groups": [{"params": ["head.*"], "lr": 0.0, "weight_decay": 0.3}]},
    {"name": "prodigy", "betas": [0.0, 0.99], "d0": 1e-3, "no_weight_decay": ["*.bias"], "weight_decay": 0.2},
])
def test_the_twins_share_one_d_as_the_oracle_does(table: dict) -> None:
    """Float64, 8 updates with a gradient-free first update, a hole and an empty update: torch and
    JAX within 1e-12 of the oracle, normwise relative (measured 3e-16 to 5.2e-15, the largest where
    β1 = 0 carries the parameters to 500; about 20 roundings per entry and update, and the d
    estimate's sums over 14 entries); every parameter's entry holds the same d."""
    rng = np.random.default_rng(7)
    params = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    out = run_all(spec_of(table), params, _stream(rng, 8))
    early = table.get("decouple", True)  # L2 decay makes the zero gradient wd·p: no early return
    if early:
        assert out["oracle"]["state"][0] == {}  # the early return: nothing changes
        assert all(np.array_equal(out["oracle"]["params"][0][k], v) for k, v in params.items())
    for side in ("torch", "jax"):
        assert worst(out[side], out["oracle"]) <= 1e-12, side
    last = out["oracle"]["state"][-1]
    assert len({float(e["d"]) for e in last.values()}) == 1 and float(last["head.weight"]["k"]) == 7 - early
    assert int(last["enc.bias"]["step"]) == 6 - early and float(last["head.weight"]["d"]) > 1.5 * table["d0"]


def test_torch_s_step_reads_nothing_back_from_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """No .item(), bool(tensor) or .tolist() inside an update (prodigyopt reads two numbers per
    parameter); the control: the same guard catches a planted read."""
    from ref_torch._prodigy import Prodigy

    params = [torch.nn.Parameter(torch.randn(3, 2, dtype=torch.float64)) for _ in range(2)]
    opt = Prodigy(params, d0=1e-3, use_bias_correction=True, growth_rate=1.5)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a device read inside the step")

    for t in range(6):
        for p in params:
            p.grad = 1.0 + torch.randn_like(p)  # a steady pull: d grows
        with monkeypatch.context() as m:
            for name in ("item", "__bool__", "tolist"):
                m.setattr(torch.Tensor, name, refuse)
            opt.step()
            with pytest.raises(AssertionError, match="device read"):
                float(params[0].sum().item())
    assert float(opt.state[params[0]]["d"]) > 1e-3


def _per_parameter_d(hps, owner, params, grads, states, real=prodigy.update_all):
    """A mutant: every parameter keeps its own d (each updated as if it were alone)."""
    out, new = dict(params), {k: v for k, v in states.items()}
    for name in params:
        one = {name: grads[name]} if name in grads else {}
        p, s = real(hps, owner, {name: params[name]}, one, {name: states[name]} if name in states else {})
        out[name] = p[name]
        new.update(s)
    return out, new


def _set(key: str, value: object):
    return lambda hps, *rest, real=prodigy.update_all: real([{**h, key: value} for h in hps], *rest)


MUTANTS = {
    "one d per parameter": (_per_parameter_d, ["coupled-safeguard", "groups", "beta1-zero"]),  # closed: one x
    "bias correction on (optax.contrib.prodigy's)": (_set("use_bias_correction", True), ["closed", "groups"]),
    "no safeguard_warmup": (_set("safeguard_warmup", False), ["coupled-safeguard"]),
    "d grows without a cap": (_set("growth_rate", math.inf), ["coupled-safeguard", "beta1-zero"]),
    "decay always decoupled": (_set("decouple", True), ["coupled-safeguard"]),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(mutant: str) -> None:
    rewrite, must_fail = MUTANTS[mutant]

    def run(*args: object, **kw: object) -> dict:
        with mock.patch.object(prodigy, "update_all", rewrite):
            return oracle.run_trajectory(*args, **kw)

    backend = PatchedBackend("oracle", patches=(("optimizers", "run_trajectory", run),), label=mutant)
    for name in must_fail:
        case = CASES[f"optimizer/prodigyopt-prodigy-{name}"]
        assert run_case(case, Backend("oracle")).passed, f"{case.id} must pass unmutated"
        assert not run_case(case, backend).passed, f"{mutant}: {case.id} did not catch it"


def test_the_torch_snippet_carries_the_twin_s_prodigy_with_its_groups() -> None:
    """port --to torch writes ref_torch's Prodigy out (groups whose lr is 0, biases without decay)
    and equals the torch backend; the optax snippet is prodigyopt's mathematics in one transform
    and refuses several groups, naming them (tests/test_port_code.py checks one group on both)."""
    from conformance.errors import UnsupportedError
    from conformance.port.verify.traces import self_check
    from conformance.port.write.optax_code import optax_code
    from conformance.port.write.torch_code import torch_code

    config = load_config({"optimizer": {"name": "prodigy", "d0": 1e-3, "weight_decay": 0.1, "no_weight_decay": ["*.b"],
                                        "groups": [{"params": ["head.*"], "lr": 0.0, "eps": 1e-6}]}})
    err, failure, updates = self_check(config, "torch", torch_code)
    assert failure is None and err == 0.0 and updates == 8
    assert "class Prodigy(torch.optim.Optimizer)" in torch_code(config)
    with pytest.raises(UnsupportedError, match=r"^to_code: prodigy with several parameter groups"):
        optax_code(config)


def test_optax_native_exports_optax_s_one_d_under_the_neutral_names() -> None:
    """optax.contrib.prodigy's estim_lr is d and, uncapped, d_max; its numerator and count are
    d_numerator and k; the trajectory equals the oracle's on the bias-corrected case (PR-BC).
    d_numerator sums ⟨g, p0 − p⟩ with p 1e-3 from p0 at |p| ≈ 1, so its rounding is ~1e-16 / 1e-3
    relative: measured 5.8e-14, under the 1e-12 bound; d, d_max and k are equal."""
    case = CASES["optimizer/prodigyopt-prodigy-bias-corrected"]
    assert run_case(case, Backend("optax-native")).passed
    inputs = tomllib.loads(case.path.read_text())["inputs"]
    runs = run_all(case.sections["optimizer"], inputs["params"], None, backends=("optax-native", "oracle"),
                   objective=inputs["objective"], steps=3)
    for got, ref in zip(runs["optax-native"]["state"], runs["oracle"]["state"]):
        assert set(got["w"]) == set(ref["w"])
        for key in ("d", "d_max", "d_numerator", "k"):
            assert float(got["w"][key]) == pytest.approx(float(ref["w"][key]), rel=1e-12, abs=1e-300), key


def test_optax_contrib_prodigy_is_nan_at_lr_0_where_prodigyopt_returns_early() -> None:
    """PR-BC: an lr of 0 at the first update (a warm-up from 0) leaves prodigyopt's parameters and
    state as they were (Σ|s| = 0: its early return), the oracle's too; optax.contrib.prodigy divides
    0 by 0 and carries NaN ever after. Control: at lr 0.5 optax's first update is finite."""
    import jax
    import jax.numpy as jnp
    import optax

    spec = spec_of({"name": "prodigy", "d0": 1e-3, "use_bias_correction": True})
    params, grads = {"w": np.array([1.0, -2.0])}, [{"w": np.array([0.3, -0.1])}] * 2
    hp = [dict(g.hyperparams) for g in resolve_groups(spec, {"w": (2,)})]
    p, st = prodigy.update_all([{**h, "lr": 0.0} for h in hp], {"w": 0}, params, grads[0], {})
    assert st == {} and np.array_equal(p["w"], params["w"])
    with jax.enable_x64(True):
        for lr, finite in ((lambda c: jnp.where(c == 0, 0.0, 0.5), False), (0.5, True)):
            tx = optax.contrib.prodigy(learning_rate=lr, estim_lr0=1e-3)
            u, _ = tx.update({"w": jnp.asarray(grads[0]["w"])}, tx.init({"w": jnp.asarray(params["w"])}),
                             {"w": jnp.asarray(params["w"])})
            assert bool(jnp.all(jnp.isfinite(u["w"]))) is finite


def test_the_optax_snippet_s_transform_is_the_oracle_s_through_an_early_return() -> None:
    """port --to optax's prodigyopt_prodigy on a stream whose first update has only zero gradients
    (prodigyopt's early return) and then β1 = 0: the oracle's parameters and its d. The bound, 1e-12
    absolute, is the suite's float64 convention over a derived ~1e-14 (about 15 roundings per entry
    and update of values ≤ 1.7, over 6 updates); the smallest compared value is 0.0177, so it stands
    for at most 5.7e-11 relative. Measured: 2.2e-16."""
    import jax
    import jax.numpy as jnp
    import optax

    from conformance.port.write import optax_parts

    space: dict = {"jax": jax, "jnp": jnp, "optax": optax}
    exec(optax_parts.PRODIGY, space)  # noqa: S102  the snippet's own source
    table = {"name": "prodigy", "betas": [0.0, 0.99], "d0": 1e-3, "weight_decay": 0.1, "growth_rate": 1.5}
    rng = np.random.default_rng(5)
    params = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    grads = [{k: np.zeros(s) for k, s in SHAPES.items()}] + [
        {k: 1.0 + 0.5 * rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(5)]
    want = oracle.run_trajectory(spec_of(table), params, grads)
    with jax.enable_x64(True):
        tx = space["prodigyopt_prodigy"](1.0, (0.0, 0.99), math.sqrt(0.99), 1e-8, 0.1, True, False, False, 1e-3,
                                         1.0, 1.5)
        p = {k: jnp.asarray(v) for k, v in params.items()}
        st = tx.init(p)
        for t, g in enumerate(grads):
            u, st = tx.update({k: jnp.asarray(v) for k, v in g.items()}, st, p)
            p = optax.apply_updates(p, u)
            for k in SHAPES:
                np.testing.assert_allclose(np.asarray(p[k]), want["params"][t][k], rtol=0, atol=1e-12)
        assert float(st["d"]) == pytest.approx(float(want["state"][-1]["enc.weight"]["d"]), rel=1e-12)
        assert float(st["k"]) == 5.0 and float(st["d"]) > 1e-3


def test_fsdp_refuses_prodigy_naming_both_fields() -> None:
    """A rank holds only its shards, and Prodigy's d sums over every parameter: refused before
    anything runs, pointing at ddp (where two ranks equal one process: measured 3e-16). Control:
    AdamW passes the same check."""
    from ref_torch import _fsdp

    config = load_config({"optimizer": {"name": "prodigy"}, "run": {"parallel": "fsdp", "device": "cpu"}})
    with pytest.raises(ConfigError, match=r"^optimizer\.name = 'prodigy' with run\.parallel = 'fsdp' .* 'ddp'$"):
        _fsdp.check(config)
    _fsdp.check(load_config({"optimizer": {"name": "adamw"}, "run": {"parallel": "fsdp", "device": "cpu"}}))
