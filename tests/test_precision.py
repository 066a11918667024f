"""Mixed precision: the [precision] spec, GradScaler's state machine on both frameworks, unscaling,
the non-finite policy, the dtype policy and the numerics contexts."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.config import load_config
from conformance.config.precision import PrecisionSpec
from conformance.errors import ConfigError, InputError, NonFiniteError
from conformance.oracle import precision as oracle
from ref_jax import precision as jp
from ref_torch import precision as tp


def grad_scaler_trace(finite: list[bool], **args) -> tuple[list[float], list[int]]:
    """Scales in force and trackers after update() from a real torch.amp.GradScaler('cpu') run."""
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **args)
    scales, trackers = [], []
    for ok in finite:
        opt.zero_grad()
        scaler.scale((p * p).sum() * (1.0 if ok else math.inf)).backward()
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
        trackers.append(scaler.state_dict()["_growth_tracker"])
    return scales, trackers


# ---------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------


def test_spec_defaults_follow_grad_scaler() -> None:
    spec = PrecisionSpec(dtype="float16")
    assert spec.dynamic_scaling and spec.param_dtype == "float32" and spec.autocast
    assert (spec.init_scale, spec.growth_factor, spec.backoff_factor, spec.growth_interval) == (65536.0, 2.0, 0.5, 2000)
    assert not PrecisionSpec(dtype="bfloat16").dynamic_scaling
    assert PrecisionSpec(dtype="float64").param_dtype == "float64"
    assert PrecisionSpec(loss_scale="dynamic").dynamic_scaling


@pytest.mark.parametrize(("data", "message"), [
    ({"init_scale": 8.0}, "precision.init_scale is only used with dynamic loss scaling"),
    ({"dtype": "float16", "on_nonfinite": "raise"}, "precision.on_nonfinite = 'raise' would stop"),
    ({"dtype": "float16", "growth_factor": 1.0}, "precision.growth_factor must be in (1, "),
    ({"dtype": "float16", "backoff_factor": 0.0}, "precision.backoff_factor must be in (0, 1)"),
    ({"dtype": "float16", "init_scale": 1e39}, "precision.init_scale must be in (0, "),
    ({"max_consecutive_skips": 0}, "precision.max_consecutive_skips must be in [1, 2^63 - 1]"),
    ({"dtype": "float8"}, "precision.dtype must be one of"),
])
def test_spec_errors_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"precision": data})
    assert message in str(err.value)


def test_schedule_on_skip() -> None:
    hold, advance = PrecisionSpec(), PrecisionSpec(schedule_on_skip="advance")
    assert hold.schedule_advances(False) and not hold.schedule_advances(True)
    assert advance.schedule_advances(True)
    assert hold.schedule_position(5, 2) == 3 and advance.schedule_position(5, 2) == 5


# ---------------------------------------------------------------------------------------------
# the loss-scale state machine equals GradScaler's
# ---------------------------------------------------------------------------------------------


@given(finite=st.lists(st.booleans(), min_size=1, max_size=30),
       growth=st.sampled_from([2.0, 1.5, 3.0, 1.1]), backoff=st.sampled_from([0.5, 0.25, 0.3, 0.9]),
       interval=st.integers(1, 4), init=st.sampled_from([1.0, 1000.0, 2.0**16, 2.0**126]))
def test_state_machine_equals_grad_scaler(finite, growth, backoff, interval, init) -> None:
    args = dict(init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    want_scales, want_trackers = grad_scaler_trace(finite, **args)
    spec = PrecisionSpec(loss_scale="dynamic", max_consecutive_skips=None, **args)
    assert oracle.loss_scale_trace(spec, finite)["scale"] == want_scales
    assert tp.loss_scale_trace(spec, finite) == {"scale": want_scales, "skipped": [not f for f in finite],
                                                 "growth_tracker": want_trackers}
    with jax.enable_x64(True):
        assert jp.loss_scale_trace(spec, finite)["scale"] == want_scales


def test_jax_without_x64_is_exact_for_float32_factors() -> None:
    finite = [True, False, True, True, False, False, True, True, True] * 3
    spec = PrecisionSpec(loss_scale="dynamic", init_scale=1000.0, growth_factor=1.5, backoff_factor=0.25,
                         growth_interval=2)
    assert jp.loss_scale_trace(spec, finite)["scale"] == grad_scaler_trace(
        finite, init_scale=1000.0, growth_factor=1.5, backoff_factor=0.25, growth_interval=2)[0]


def test_jax_without_x64_rounds_inexact_factors_to_float32() -> None:
    # documented limitation (docs/divergences.md#precision): no float64 without x64
    spec = PrecisionSpec(loss_scale="dynamic", backoff_factor=0.3)
    state = jp.LossScaleState(jnp.asarray(90.0, jnp.float32), jnp.asarray(0, jnp.int32))
    assert float(jp.update_scale(spec, state, False).scale) == float(np.float32(90.0 * np.float32(0.3)))
    assert float(np.float32(90.0 * np.float32(0.3))) != 27.0
    with jax.enable_x64(True):
        assert float(jp.update_scale(spec, state, False).scale) == 27.0
    assert float(tp.update_scale(spec, tp.LossScaleState(torch.tensor(90.0), torch.tensor(0, dtype=torch.int32)),
                                 torch.tensor(False)).scale) == 27.0


@given(st.floats(1e-30, 1e30).map(np.float32))
def test_float32_reciprocal_equals_grad_scalers_float64_reciprocal(scale) -> None:
    # why the no-x64 JAX unscale is exact: double rounding is innocuous for division
    assert jp._inverse(jnp.asarray(scale, jnp.float32)) == oracle.inverse_scale(scale)


# ---------------------------------------------------------------------------------------------
# unscaling and the finite check
# ---------------------------------------------------------------------------------------------


def _unscale_both(scale: float, grads: dict[str, np.ndarray]) -> tuple[dict, bool, dict, bool]:
    t_grads = {k: torch.tensor(v, dtype=torch.float32) for k, v in grads.items()}
    t_out, t_ok = tp.unscale_grads(tp.LossScaleState(torch.tensor(scale), torch.tensor(0, dtype=torch.int32)), t_grads)
    j_out, j_ok = jp.unscale_grads(jp.LossScaleState(jnp.asarray(scale, jnp.float32), jnp.asarray(0)),
                                   {k: jnp.asarray(v, jnp.float32) for k, v in grads.items()})
    return ({k: v.numpy() for k, v in t_out.items()}, bool(t_ok),
            {k: np.asarray(v) for k, v in j_out.items()}, bool(j_ok))


@pytest.mark.parametrize("bad", [None, math.inf, -math.inf, math.nan])
def test_unscale_equals_grad_scaler_unscale(bad) -> None:
    rng = np.random.default_rng(0)
    grads = {"w": rng.normal(size=(3, 2)).astype(np.float32) * 1024, "b": rng.normal(size=2).astype(np.float32)}
    if bad is not None:
        grads["b"][1] = bad
    p = {k: torch.nn.Parameter(torch.zeros(v.shape)) for k, v in grads.items()}
    opt = torch.optim.SGD(list(p.values()), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.zeros(()))  # creates the scale tensor
    for k, v in grads.items():
        p[k].grad = torch.tensor(v)
    scaler.unscale_(opt)
    found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
    t_out, t_ok, j_out, j_ok = _unscale_both(1024.0, grads)
    assert t_ok == j_ok == (found == 0) == (bad is None)
    for k in grads:
        np.testing.assert_array_equal(t_out[k], p[k].grad.numpy())
        np.testing.assert_array_equal(j_out[k], p[k].grad.numpy())


def test_unscale_catches_overflow_that_grad_scaler_misses() -> None:
    # pinned framework behaviour: below scale 1, GradScaler checks the scaled value and lets inf through
    g = torch.tensor([1e38])
    found = torch.zeros(())
    torch._amp_foreach_non_finite_check_and_unscale_([g], found, torch.tensor(1024.0))
    assert float(found) == 0 and math.isinf(float(g))
    t_out, t_ok, j_out, j_ok = _unscale_both(2.0**-10, {"w": np.array([1e38], np.float32)})
    assert not t_ok and not j_ok and math.isinf(t_out["w"][0]) and math.isinf(j_out["w"][0])


@pytest.mark.parametrize("ns", [tp, jp], ids=["torch", "jax"])
def test_state_round_trips_through_neutral_dict(ns) -> None:
    spec = PrecisionSpec(dtype="float16", growth_interval=3)
    state = ns.init_scale_state(spec)
    for ok in (True, True, False, True):
        state = ns.update_scale(spec, state, ok)
    data = ns.scale_state_to_dict(state)
    assert data == {"scale": 32768.0, "growth_tracker": 1}
    assert ns.scale_state_to_dict(ns.scale_state_from_dict(data)) == data
    grad_scaler_form = {"scale": 4.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
                        "_growth_tracker": 2}
    assert ns.scale_state_to_dict(ns.scale_state_from_dict(grad_scaler_form)) == {"scale": 4.0, "growth_tracker": 2}
    with pytest.raises(InputError, match="needs 'scale' and 'growth_tracker'"):
        ns.scale_state_from_dict({"scale": 1.0})


@pytest.mark.parametrize("ns", [tp, jp], ids=["torch", "jax"])
def test_loss_scaler_resumes_identically(ns) -> None:
    spec = PrecisionSpec(dtype="float16", growth_interval=2)
    flags = [True, False, True, True, True, False, True]
    whole = ns.LossScaler(spec)
    for ok in flags:
        whole.update(ok)
    first = ns.LossScaler(spec)
    for ok in flags[:3]:
        first.update(ok)
    resumed = ns.LossScaler(spec)
    resumed.load_state_dict(first.state_dict())
    for ok in flags[3:]:
        resumed.update(ok)
    assert resumed.state_dict() == whole.state_dict()
    assert ns.LossScaler(PrecisionSpec()).get_scale() is None


# ---------------------------------------------------------------------------------------------
# the non-finite policy
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ns", [tp, jp], ids=["torch", "jax"])
def test_raise_names_the_first_nonfinite_tensor(ns) -> None:
    spec = PrecisionSpec(on_nonfinite="raise")
    skips = ns.record_update(ns.init_skip_state(), False)
    with pytest.raises(NonFiniteError, match=r"^the loss is non-finite at update 4 \(precision.on_nonfinite"):
        ns.check_nonfinite(spec, skips, False, {"w": False}, update=4)
    with pytest.raises(NonFiniteError, match=r"^the gradient of 'b' \(and 1 more\) is non-finite at update 0"):
        ns.check_nonfinite(spec, skips, True, {"w": True, "b": False, "c": False}, update=0)
    ns.check_nonfinite(spec, ns.record_update(ns.init_skip_state(), True), True, {"w": True})


@pytest.mark.parametrize("ns", [tp, jp], ids=["torch", "jax"])
def test_consecutive_skip_limit(ns) -> None:
    spec = PrecisionSpec(max_consecutive_skips=2)
    skips = ns.init_skip_state()
    for ok in (False, False, True, False, False):
        skips = ns.record_update(skips, ok)
        ns.check_nonfinite(spec, skips, True, {"w": ok})
    assert (int(skips.skipped), int(skips.consecutive)) == (4, 2)
    skips = ns.record_update(skips, False)
    with pytest.raises(NonFiniteError, match="3 consecutive updates were skipped .*max_consecutive_skips = 2; "
                                             "last: the gradient of 'w'"):
        ns.check_nonfinite(spec, skips, True, {"w": False})


def test_finite_flags_name_nested_parameters_in_order() -> None:
    grads = {"layer": {"w": jnp.array([1.0, jnp.nan]), "b": jnp.array([0.0])}, "head": jnp.array([2.0])}
    loss_ok, flags = jp.finite_flags(jnp.asarray(1.0), grads)
    assert bool(loss_ok) and {k: bool(v) for k, v in flags.items()} == {"layer.w": False, "layer.b": True,
                                                                         "head": True}


# ---------------------------------------------------------------------------------------------
# dtype policy and numerics contexts
# ---------------------------------------------------------------------------------------------


def test_policies_agree() -> None:
    spec = PrecisionSpec(dtype="bfloat16")
    t, j = tp.get_policy(spec), jp.get_policy(spec)
    assert (t.param_dtype, t.compute_dtype, t.output_dtype) == (torch.float32, torch.bfloat16, torch.float32)
    assert (j.param_dtype, j.compute_dtype, j.output_dtype) == (jnp.float32, jnp.bfloat16, jnp.float32)
    cast = j.cast_to_compute({"w": jnp.ones(2), "i": jnp.arange(2)})
    assert cast["w"].dtype == jnp.bfloat16 and cast["i"].dtype == jnp.int32
    tcast = t.cast_to_compute({"w": torch.ones(2), "i": torch.arange(2)})
    assert tcast["w"].dtype == torch.bfloat16 and tcast["i"].dtype == torch.int64


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_autocast_on_cpu(dtype: str) -> None:
    spec = PrecisionSpec(dtype=dtype)
    with tp.autocast(spec, "cpu"):
        out = torch.ones(2, 3) @ torch.ones(3, 2)
    assert out.dtype == getattr(torch, dtype)
    with tp.autocast(PrecisionSpec(), "cpu"):
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.float32


def test_numerics_contexts_set_and_restore() -> None:
    before = torch.get_float32_matmul_precision()
    with tp.numerics_context(PrecisionSpec(allow_tf32=True)):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
    with tp.numerics_context(PrecisionSpec()):
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == before
    with jp.numerics_context(PrecisionSpec(dtype="float64", allow_tf32=True)):
        assert jax.config.jax_default_matmul_precision == "tensorfloat32"
        assert jnp.zeros(()).dtype == jnp.float64
    with jp.numerics_context(PrecisionSpec()):
        assert jax.config.jax_default_matmul_precision == "float32"
