"""The weights' EMA ([ema]) on every backend: random decay / every / start over random optimizer
trajectories, torch == jax == oracle in float64 (hypothesis), its dtype (float32, float64 for float64
weights), and the checkpoint round trip of both twins' states. Training with it:
tests/test_trainer_averaging.py; the cases: conformance/cases/optimizer/ema-*."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.optimizers import random_spec, run_all, worst

from conformance.config import EmaSpec
from conformance.errors import CheckpointError


@st.composite
def ema_specs(draw) -> EmaSpec:
    return EmaSpec(decay=draw(st.floats(0.0, 1.0)), every=draw(st.integers(1, 4)), start=draw(st.integers(0, 6)))


@given(st.data())
def test_random_emas_agree_in_float64(data) -> None:
    spec, params, grads = data.draw(random_spec(updates=12))
    ema = data.draw(ema_specs())
    out = run_all(spec, params, grads, "float64", ema=ema)
    want = out["oracle"]["ema"]
    for side in ("torch", "jax"):
        got = out[side]["ema"]
        assert [g is None for g in got] == [w is None for w in want], side
        started = [i for i, w in enumerate(want) if w is not None]
        as_trace = lambda seq: {"params": [seq[i] for i in started]}  # noqa: E731
        assert worst(as_trace(got), as_trace(want), states=False) <= 1e-12, side


@pytest.mark.parametrize(("dtype", "want"), [("float32", "float32"), ("float64", "float64"), ("bfloat16", "float32")])
def test_the_ema_is_float32_or_the_weights_float64(framework, dtype: str, want: str) -> None:
    ema = framework.module("ema")
    if framework.name == "torch":
        import torch

        params = {"w": torch.zeros(3, dtype=getattr(torch, dtype))}
    else:
        import jax.numpy as jnp

        params = {"w": jnp.zeros(3, getattr(jnp, dtype))}
    state = ema.update_ema(EmaSpec(decay=0.9), ema.init_ema(EmaSpec(decay=0.9), params), params, True)
    assert ema.export_ema(state)["w"].dtype == np.dtype(want)
    assert ema.init_ema(EmaSpec(), params) is None


def test_import_refuses_an_ema_of_another_shape(framework) -> None:
    ema = framework.module("ema")
    if framework.name == "torch":
        import torch

        params = {"w": torch.zeros(3, dtype=torch.float64)}
    else:
        import jax.numpy as jnp

        params = {"w": jnp.zeros(3, jnp.float64)}
    state = ema.init_ema(EmaSpec(decay=0.5), params)
    back = ema.import_ema(state, {"w": np.arange(3.0)})
    np.testing.assert_array_equal(ema.export_ema(back)["w"], np.arange(3.0))
    assert ema.export_ema(ema.import_ema(state, None)) is None
    with pytest.raises(CheckpointError, match="ema/w has shape"):
        ema.import_ema(state, {"w": np.zeros(4)})
