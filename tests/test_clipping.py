"""Gradient clipping: the [clip] spec, equality with torch.nn.utils and optax on every backend, the
returned pre-clip norm, in-place vs pure semantics, error_if_nonfinite."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from conformance.config import load_config
from conformance.config.clip import ClipSpec
from conformance.errors import ConfigError, NonFiniteError
from ref_jax import clipping as jc
from ref_torch import clipping as tc

finite = st.floats(-1e3, 1e3, allow_nan=False, width=64)
grad_sets = st.fixed_dictionaries({
    "w": arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 4)), elements=finite),
    "b": arrays(np.float64, st.integers(1, 4), elements=finite),
})
norm_types = st.sampled_from([2.0, 1.0, math.inf, 3.0, 0.5])
# the backend fixture is a numerics context, safe to share between generated inputs
shared_fixture = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def torch_builtin(spec: ClipSpec, grads: dict, dtype=torch.float64) -> tuple[dict, float]:
    """torch.nn.utils on parameters holding `grads`: the expected values."""
    params = []
    for v in grads.values():
        p = torch.nn.Parameter(torch.zeros(v.shape, dtype=dtype))
        p.grad = torch.tensor(v, dtype=dtype)
        params.append(p)
    if spec.clip_value is not None and spec.mode != "value":  # a torch user's two calls, value first
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], spec.norm_type)  # logged: before both
        torch.nn.utils.clip_grad_value_(params, spec.clip_value)
        for group in ([p] for p in params) if spec.per_parameter else [params]:
            torch.nn.utils.clip_grad_norm_(group, spec.max_norm, spec.norm_type)
    elif spec.mode == "global_norm":
        norm = torch.nn.utils.clip_grad_norm_(params, spec.max_norm, spec.norm_type)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], spec.norm_type)
        if spec.mode == "per_parameter":
            for p in params:
                torch.nn.utils.clip_grad_norm_([p], spec.max_norm, spec.norm_type)
        elif spec.mode == "value":
            torch.nn.utils.clip_grad_value_(params, spec.clip_value)
    return {k: p.grad.double().numpy() for k, p in zip(grads, params)}, float(norm)


def assert_close(got: dict, want: dict, atol: float, rtol: float) -> None:
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=atol, rtol=rtol, err_msg=k)


# ---------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "Infinity", math.inf])
def test_norm_type_inf(value) -> None:
    assert math.isinf(load_config({"clip": {"max_norm": 1.0, "norm_type": value}}).clip.norm_type)


def test_clip_value_with_max_norm_clamps_then_applies_the_norm_rule() -> None:
    spec = load_config({"clip": {"max_norm": 1.0, "clip_value": 0.5}}).clip
    assert (spec.mode, spec.clip_value) == ("global_norm", 0.5)


@pytest.mark.parametrize(("data", "message"), [
    ({"eps": 0.0}, "clip.eps is only used with max_norm"),
    ({"per_parameter": True}, "clip.per_parameter is only used with max_norm"),
    ({"max_norm": 1.0, "norm_type": 0}, "clip.norm_type must be > 0 (or inf)"),
    ({"max_norm": -1.0}, "clip.max_norm must be > 0"),
    ({"max_norm": 1.0, "eps": -1e-6}, "clip.eps must be >= 0"),
])
def test_spec_errors_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"clip": data})
    assert message in str(err.value)


# ---------------------------------------------------------------------------------------------
# equality with the frameworks' own clipping
# ---------------------------------------------------------------------------------------------


@shared_fixture
@given(grads=grad_sets, p=norm_types, max_norm=st.floats(1e-3, 1e3),
       mode=st.sampled_from(["global", "per_parameter", "value", "none", "value_then_global", "value_then_each"]))
def test_equals_torch_builtins(backend, grads, p, max_norm, mode) -> None:
    spec = {"global": ClipSpec(max_norm=max_norm, norm_type=p),
            "per_parameter": ClipSpec(max_norm=max_norm, norm_type=p, per_parameter=True),
            "value": ClipSpec(clip_value=max_norm, norm_type=p), "none": ClipSpec(norm_type=p),
            "value_then_global": ClipSpec(clip_value=max_norm / 3, max_norm=max_norm, norm_type=p),
            "value_then_each": ClipSpec(clip_value=max_norm / 3, max_norm=max_norm, norm_type=p, per_parameter=True),
            }[mode]
    want, norm = torch_builtin(spec, grads)
    got = backend.function("clipping", "clip_and_norm")(spec, grads)
    if backend.name == "torch":  # the production path calls the built-ins: bit for bit
        assert got["total_norm"] == norm
        assert_close(got["grads"], want, 0.0, 0.0)
    else:
        assert got["total_norm"] == pytest.approx(norm, rel=1e-13, abs=1e-300)
        assert_close(got["grads"], want, 1e-12, 1e-10)


@shared_fixture
@given(grads=grad_sets, max_norm=st.floats(1e-3, 1e3))
def test_eps_zero_equals_optax(backend, grads, max_norm) -> None:
    with jax.enable_x64(True):
        tree = {k: jnp.asarray(v) for k, v in grads.items()}
        tx = optax.clip_by_global_norm(max_norm)
        want = {k: np.asarray(v) for k, v in tx.update(tree, tx.init(tree))[0].items()}
        norm = float(optax.tree.norm(tree))
    got = backend.function("clipping", "clip_and_norm")(ClipSpec(max_norm=max_norm, eps=0.0), grads)
    assert got["total_norm"] == pytest.approx(norm, rel=1e-14)
    assert_close(got["grads"], want, 1e-12, 1e-12)


@pytest.mark.parametrize("g", [[3.0, 4.0], [0.6, 0.8], [29.0, 0.0]])
def test_exact_threshold_is_clipped_with_optax_operations(backend, g) -> None:
    # optax's rule is `norm >= max_norm` -> (g / n) * c, which XLA runs as g * (1 / n) * c;
    # at n == c that can differ from g in the last bit, so compare bit for bit
    n = float(np.linalg.norm(g))
    with jax.enable_x64(True):
        tree = {"g": jnp.asarray(g)}
        tx = optax.clip_by_global_norm(n)
        want = np.asarray(tx.update(tree, tx.init(tree))[0]["g"])
    got = backend.function("clipping", "clip_and_norm")(ClipSpec(max_norm=n, eps=0.0), {"g": np.array(g)})
    np.testing.assert_array_equal(got["grads"]["g"], want)


def test_float32_torch_is_bit_for_bit_and_jax_within_float32(framework) -> None:
    rng = np.random.default_rng(3)
    grads = {"w": rng.normal(size=(4, 5)).astype(np.float32).astype(np.float64), "b": np.ones(5) * 3}
    spec = ClipSpec(max_norm=1.0)
    want, norm = torch_builtin(spec, grads, torch.float32)
    got = framework.function("clipping", "clip_and_norm")(spec, grads, dtype="float32")
    tol = (0.0, 0.0) if framework.name == "torch" else (1e-7, 1e-6)
    assert_close(got["grads"], want, *tol)
    assert got["total_norm"] == pytest.approx(norm, rel=tol[1], abs=tol[0])


# ---------------------------------------------------------------------------------------------
# framework-level API
# ---------------------------------------------------------------------------------------------


def test_torch_clips_in_place() -> None:
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    p.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)
    grads, norm = tc.clip_gradients(ClipSpec(max_norm=1.0, eps=0.0), {"p": p.grad, "unused": None})
    assert grads["p"] is p.grad and float(norm) == 5.0
    assert p.grad.tolist() == [0.6000000000000001, 0.8]


@jax.enable_x64(True)
def test_jax_is_pure_and_jittable() -> None:
    spec = ClipSpec(max_norm=1.0, norm_type=math.inf, error_if_nonfinite=True)
    grads = {"a": jnp.array([3.0, -4.0]), "b": {"c": jnp.array([1.0])}}
    clipped, norm = jax.jit(lambda g: jc.clip_gradients(spec, g))(grads)
    assert float(norm) == 4.0 and grads["a"].tolist() == [3.0, -4.0]
    np.testing.assert_allclose(np.asarray(clipped["a"]), np.array([3.0, -4.0]) / (4.0 + 1e-6), rtol=1e-15)
    bad = {"a": jnp.array([jnp.inf]), "b": {"c": jnp.array([1.0])}}
    _, bad_norm = jax.jit(lambda g: jc.clip_gradients(spec, g))(bad)  # inside jit: no raise ...
    with pytest.raises(NonFiniteError, match="gradient of 'a'"):  # ... the host check raises
        jc.check_norm(spec, bad_norm, bad)


@pytest.mark.parametrize("grads", [{"w": [1.0, 2.0], "b": [math.nan]}, {"w": [1.0, math.inf], "b": [math.nan]}])
def test_error_if_nonfinite_names_first_bad_gradient(backend, grads) -> None:
    spec = ClipSpec(max_norm=1.0, error_if_nonfinite=True)
    with pytest.raises(NonFiniteError) as err:
        backend.function("clipping", "clip_and_norm")(spec, {k: np.array(v) for k, v in grads.items()})
    first = "w" if not all(map(math.isfinite, grads["w"])) else "b"
    assert str(err.value).startswith(f"clip.error_if_nonfinite: the gradient of {first!r} is non-finite")


def test_error_if_nonfinite_reports_norm_overflow(backend) -> None:
    spec = ClipSpec(max_norm=1.0, error_if_nonfinite=True)
    with pytest.raises(NonFiniteError, match="overflowed to inf although every gradient is finite"):
        backend.function("clipping", "clip_and_norm")(spec, {"w": np.array([1e200, 1e200])})


def test_nonfinite_gradients_without_error(backend) -> None:
    out = backend.function("clipping", "clip_and_norm")(ClipSpec(max_norm=1.0), {"w": np.array([1.0, math.inf])})
    assert math.isinf(out["total_norm"]) and out["grads"]["w"][0] == 0.0 and math.isnan(out["grads"]["w"][1])
