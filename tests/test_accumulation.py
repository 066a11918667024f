"""Gradient accumulation: normalization once from sums and counts, equal to the full batch (tokens)
or to the mean of micro-batch means (micro_batches), partial windows, hooks, errors, and where
optax.MultiSteps does and does not match."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.errors import ConfigError, InputError
from ref_jax import accumulation as ja
from ref_jax import losses as jl
from ref_jax._window import masked_loss, stack_window
from ref_torch import accumulation as ta
from ref_torch import losses as tl

D_IN, C = 2, 3
CE = LossSpec(name="cross_entropy", label_smoothing=0.1)
shared_fixture = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def split_batches(draw, min_valid: int = 0):
    """A linear model and a list of micro-batches of unequal sizes, some possibly all ignored."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    batches = []
    for n in sizes:
        y = rng.integers(0, C, size=n)
        ignored = rng.random(n) < draw(st.sampled_from([0.0, 0.5, 1.0]))
        ignored[: min(min_valid, n)] = False
        batches.append({"x": np.round(rng.normal(size=(n, D_IN)), 3), "y": np.where(ignored, -100, y)})
    params = {"w": np.round(rng.normal(size=(D_IN, C)), 3), "b": np.round(rng.normal(size=C), 3)}
    return params, batches, draw(st.integers(1, 4))


def torch_grad(params: dict, batches: list[dict]) -> dict:
    """torch's own F.cross_entropy mean on one batch made of `batches`: the expected gradient."""
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    x = torch.tensor(np.concatenate([b["x"] for b in batches]))
    y = torch.tensor(np.concatenate([b["y"] for b in batches]))
    F.cross_entropy(x @ p["w"] + p["b"], y, label_smoothing=0.1).backward()
    return {k: v.grad.numpy() for k, v in p.items()}


def windows_of(batches: list, steps: int) -> list[list]:
    return [batches[i:i + steps] for i in range(0, len(batches), steps)]


def has_valid(batches: list[dict]) -> bool:
    return any((b["y"] != -100).any() for b in batches)


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------


@shared_fixture
@given(split_batches())
def test_tokens_equals_full_batch(backend, data) -> None:
    params, batches, steps = data
    spec = AccumulationSpec(steps=steps, normalize="tokens")
    windows = windows_of(batches, steps)
    if not all(has_valid(w) for w in windows):
        with pytest.raises(InputError, match="has no valid elements"):
            backend.function("accumulation", "window_gradients")(CE, spec, params, batches)
        return
    got = backend.function("accumulation", "window_gradients")(CE, spec, params, batches)
    assert len(got["grads"]) == len(windows)
    for g, window in zip(got["grads"], windows):
        want = torch_grad(params, window)
        for k in want:
            np.testing.assert_allclose(g[k], want[k], atol=1e-12, rtol=1e-10)


@shared_fixture
@given(split_batches(min_valid=1))
def test_micro_batches_equals_mean_of_micro_batch_means(backend, data) -> None:
    params, batches, steps = data
    spec = AccumulationSpec(steps=steps, normalize="micro_batches")
    got = backend.function("accumulation", "window_gradients")(CE, spec, params, batches)
    for g, window in zip(got["grads"], windows_of(batches, steps)):
        means = [torch_grad(params, [mb]) for mb in window]
        for k in g:  # the real window size divides, also for the incomplete last window
            np.testing.assert_allclose(g[k], sum(m[k] for m in means) / len(window), atol=1e-12, rtol=1e-10)


def test_last_window_drop_and_update() -> None:
    assert AccumulationSpec(steps=4).windows(10) == [4, 4, 2]
    assert AccumulationSpec(steps=4, last_window="drop").windows(10) == [4, 4]
    assert AccumulationSpec(steps=4, last_window="drop").updates_per_epoch(3) == 0
    assert AccumulationSpec(steps=3).windows(0) == []


# ---------------------------------------------------------------------------------------------
# framework-level API: one compiled loop (JAX), hooks
# ---------------------------------------------------------------------------------------------


def _linear_loss_jax(p, mb):
    return jl.compute_loss(CE, ja.linear_forward(p, mb["x"]), mb["y"])


def _linear_loss_torch(p, mb):
    return tl.compute_loss(CE, ta.linear_forward(p, mb["x"]), mb["y"])


def _equal_batches(rng: np.random.Generator, n: int, rows: int = 3) -> list[dict]:
    return [{"x": rng.normal(size=(rows, D_IN)), "y": rng.integers(0, C, size=rows)} for _ in range(n)]


def _laid_out(batches: list[dict], counts=None, steps: int | None = None, rows: int | None = None) -> dict:
    """NumPy micro-batches laid out for the JAX loop, as the trainer and window_gradients do."""
    return stack_window(batches, counts, steps or len(batches), np.float64, rows)


def _padded_loss_jax(p, mb):
    out = jl.compute_loss(CE, ja.linear_forward(p, mb["x"]), mb["y"], mask=mb["mask"])
    return masked_loss(CE, out, jnp.sum(mb["mask"]))


@jax.enable_x64(True)
@pytest.mark.parametrize("normalize", ["tokens", "micro_batches"])
def test_jax_scan_equals_python_loop_under_jit(normalize: str) -> None:
    # A-ORDER: the one loop (lax.scan from zeros, jitted) adds the micro-batch gradients in order,
    # as a Python loop of jax.grad calls does (the first gradient, then +=) and torch's .grad +=
    rng = np.random.default_rng(0)
    batches = _equal_batches(rng, 3)
    batches[1]["y"][:2] = -100  # unequal valid counts in equal-shape micro-batches
    params = {"w": jnp.asarray(rng.normal(size=(D_IN, C))), "b": jnp.zeros(C)}
    counts = [float((b["y"] != -100).sum()) for b in batches]
    tokens = normalize == "tokens"

    def part(p, mb):
        out = _linear_loss_jax(p, {k: jnp.asarray(v) for k, v in mb.items()})
        return out.sum / sum(counts) if tokens else out.value / len(batches)

    grads = [jax.grad(part)(params, mb) for mb in batches]
    loop = grads[0]
    for g in grads[1:]:
        loop = jax.tree.map(jnp.add, loop, g)
    spec = AccumulationSpec(steps=3, normalize=normalize)
    scan, _ = jax.jit(lambda p, w: ja.accumulate_gradients(spec, _linear_loss_jax, p, w))(
        params, _laid_out(batches, counts))
    for a, b in zip(jax.tree.leaves(loop), jax.tree.leaves(scan)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-15, rtol=1e-14)


@jax.enable_x64(True)
@pytest.mark.parametrize("normalize", ["tokens", "micro_batches"])
def test_jax_loop_compiles_once_for_windows_of_every_size(normalize: str) -> None:
    # one fixed shape: full, short and one-micro-batch windows of unequal rows reuse one compiled loop
    rng = np.random.default_rng(0)
    sizes = [[3, 3, 3], [3, 1], [2]]
    spec = AccumulationSpec(steps=3, normalize=normalize)
    params = {"w": rng.normal(size=(D_IN, C)), "b": rng.normal(size=C)}
    tparams = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
    loop = jax.jit(lambda p, w: ja.accumulate_gradients(spec, _padded_loss_jax, p, w))
    for rows in sizes:
        batches = [{"x": rng.normal(size=(n, D_IN)), "y": rng.integers(0, C, size=n)} for n in rows]
        batches[0]["y"][0] = -100  # unequal valid counts
        counts = [float((b["y"] != -100).sum()) for b in batches]
        got, out = loop({k: jnp.asarray(v) for k, v in params.items()}, _laid_out(batches, counts, 3, rows=3))
        want, want_out = ta.accumulate_gradients(spec, _linear_loss_torch, tparams,
                                                 [{k: torch.tensor(v) for k, v in b.items()} for b in batches], counts)
        assert float(out.count) == float(want_out.count)
        np.testing.assert_allclose(float(out.loss), float(want_out.loss), rtol=1e-14)
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), want[k].numpy(), atol=1e-15, rtol=1e-13)
    assert loop._cache_size() == 1


def test_jax_window_layout() -> None:
    # the host layout: micro-batches stacked to `steps` slots and padded to `rows`, zeros elsewhere
    batches = [{"x": np.ones((2, D_IN)), "y": np.array([1, 2]), "w": np.float64(0.5)},
               {"x": np.full((1, D_IN), 2.0), "y": np.array([0]), "w": np.float64(0.25)}]
    laid = stack_window(batches, [2.0, 1.0], 3, np.float32, rows=3)
    assert laid["x"].shape == (3, 3, D_IN) and laid["y"].dtype == np.array([1]).dtype
    np.testing.assert_array_equal(laid["mask"], [[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(laid["present"], [True, True, False])
    np.testing.assert_array_equal(laid["w"], [0.5, 0.25, 0.0])  # rank-0 entries are not padded
    assert laid["x"][1, 1:].sum() == 0 and laid["x"][2].sum() == 0
    assert laid["n"] == 2 and laid["divisor"] == 3.0 and laid["divisor"].dtype == np.float32
    with pytest.raises(InputError, match="a window holds 1 to 1 micro-batches; received 2"):
        stack_window(batches, None, 1, np.float64)
    with pytest.raises(InputError, match=r"micro-batch entries \['mask'\] are the window's own"):
        stack_window([{"x": np.ones((1, 1)), "mask": np.ones(1, bool)}], None, 1, np.float64, rows=1)


def test_jax_loop_refuses_a_list_of_micro_batches() -> None:
    batches = [{"x": jnp.ones((1, D_IN)), "y": jnp.zeros(1, int)}]
    with pytest.raises(InputError, match="laid out at one fixed shape"):
        ja.accumulate_gradients(AccumulationSpec(steps=1), _linear_loss_jax, {}, batches)
    with pytest.raises(InputError, match="the window has 3 micro-batch slots; accumulation.steps = 2"):
        ja.accumulate_gradients(AccumulationSpec(steps=2), _linear_loss_jax, {}, _laid_out(
            [{"x": np.ones((1, D_IN)), "y": np.zeros(1, int)}], steps=3))


def test_torch_hooks_no_sync_reduce_count_and_scale() -> None:
    rng = np.random.default_rng(1)
    batches = [{k: torch.tensor(v) for k, v in b.items()} for b in _equal_batches(rng, 3)]
    params = {"w": torch.nn.Parameter(torch.tensor(rng.normal(size=(D_IN, C)))),
              "b": torch.nn.Parameter(torch.zeros(C, dtype=torch.float64))}
    entered = []

    @contextlib.contextmanager
    def no_sync():
        entered.append(len(entered))
        yield

    spec = AccumulationSpec(steps=3, normalize="tokens")
    base, _ = ta.accumulate_gradients(spec, _linear_loss_torch, params, batches, [3, 3, 3])
    base = {k: v.clone() for k, v in base.items()}
    params["w"].grad = torch.full_like(params["w"], 7.0)  # stale gradient: must be discarded
    grads, out = ta.accumulate_gradients(spec, _linear_loss_torch, params, batches, [3, 3, 3],
                                         scale_loss=lambda loss: loss * 4.0, reduce_count=lambda n: n / 2,
                                         no_sync=no_sync)
    assert entered == [0, 1]  # every micro-batch but the last
    assert float(out.count) == 4.5 and grads["w"] is params["w"].grad
    for k in base:  # divisor halved (x2) and loss scaled (x4)
        torch.testing.assert_close(grads[k], base[k] * 8, atol=1e-14, rtol=1e-13)


@jax.enable_x64(True)
def test_jax_hooks_reduce_count_and_scale() -> None:
    rng = np.random.default_rng(1)
    window = _laid_out(_equal_batches(rng, 2), [3, 3])
    params = {"w": jnp.asarray(rng.normal(size=(D_IN, C))), "b": jnp.zeros(C)}
    spec = AccumulationSpec(steps=2, normalize="tokens")
    base, _ = ja.accumulate_gradients(spec, _linear_loss_jax, params, window)
    grads, out = ja.accumulate_gradients(spec, _linear_loss_jax, params, window,
                                         scale_loss=lambda loss: loss * 4.0, reduce_count=lambda n: n / 2)
    assert float(out.count) == 3.0
    for k in base:
        np.testing.assert_allclose(np.asarray(grads[k]), np.asarray(base[k]) * 8, atol=1e-14, rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# errors: the same class and message on every backend
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "counts", "size", "message"), [
    (AccumulationSpec(steps=2, normalize="tokens"), None, 2, "normalize = 'tokens' needs counts"),
    (AccumulationSpec(steps=2), None, 3, "the window has 3 micro-batches; accumulation.steps = 2"),
    (AccumulationSpec(steps=2, normalize="tokens"), [1.0], 2, "counts has 1 entries for a window of 2"),
    (AccumulationSpec(steps=2, normalize="tokens"), [0, 0.0], 2, "has no valid elements"),
    (AccumulationSpec(steps=2), None, 0, "needs at least one micro-batch"),
])
@pytest.mark.parametrize("module", [ta, ja], ids=["torch", "jax"])
def test_window_errors(module, spec, counts, size, message) -> None:
    with pytest.raises(InputError, match=message):
        module.check_window(spec, size, counts)


def test_loss_reduction_must_fit_the_normalization(backend) -> None:
    params = {"w": np.ones((1, 1)), "b": np.zeros(1)}
    batches = [{"x": np.ones((1, 1)), "y": np.ones((1, 1))}]
    fn = backend.function("accumulation", "window_gradients")
    with pytest.raises(ConfigError, match="needs loss.reduction = 'mean' or 'batchmean', received 'sum'"):
        fn(LossSpec(name="mse", reduction="sum"), AccumulationSpec(normalize="tokens"), params, batches)
    with pytest.raises(ConfigError, match="reduction = 'none' gives no scalar"):
        fn(LossSpec(name="mse", reduction="none"), AccumulationSpec(), params, batches)
    with pytest.raises(InputError, match=r"micro_batches\[0\].x must have shape \(rows, 1\)"):
        fn(LossSpec(name="mse"), AccumulationSpec(), params, [{"x": np.ones((1, 2)), "y": np.ones((1, 1))}])


# ---------------------------------------------------------------------------------------------
# optax.MultiSteps: where it matches, and the framework differences it pins
# ---------------------------------------------------------------------------------------------


@jax.enable_x64(True)
def test_multisteps_matches_only_full_windows_with_a_float64_accumulator() -> None:
    rng = np.random.default_rng(2)
    batches = _equal_batches(rng, 3)
    params = {"w": jnp.asarray(rng.normal(size=(D_IN, C))), "b": jnp.asarray(rng.normal(size=C))}
    micro = [jax.grad(lambda p, mb=mb: _linear_loss_jax(p, {k: jnp.asarray(v) for k, v in mb.items()}).value)(params)
             for mb in batches]
    ours, _ = ja.accumulate_gradients(AccumulationSpec(steps=3), _linear_loss_jax, params, _laid_out(batches))

    def emitted(dtype, feed):
        tx = optax.MultiSteps(optax.sgd(1.0), every_k_schedule=3, accumulator_dtype=dtype)
        state = tx.init(params)
        for g in feed:
            updates, state = tx.update(g, state, params)
        return jax.tree.map(lambda u: -u, updates)  # sgd(1): update = -gradient

    f64 = emitted(jnp.float64, micro)
    f32 = emitted(jnp.float32, micro)
    for k in ours:
        np.testing.assert_allclose(np.asarray(f64[k]), np.asarray(ours[k]), atol=1e-15, rtol=1e-13)
        assert np.abs(np.asarray(f32[k]) - np.asarray(ours[k])).max() > 1e-10  # float32 by default
    partial = emitted(jnp.float64, micro[:2])  # an incomplete window: MultiSteps emits nothing
    assert all(float(jnp.abs(v).max()) == 0.0 for v in jax.tree.leaves(partial))
