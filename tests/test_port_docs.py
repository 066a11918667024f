"""The three worked ports of docs/porting.md, run from the page's own code blocks: the translated spec
must be the one printed there, and the port must reproduce the original set-up at every update."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from support.port import float64_default

from conformance import tomlio
from conformance.cli import main
from conformance.config import load_config
from conformance.config.model import ModelSpec
from conformance.harness.backends import Backend
from conformance.port import from_optax, from_torch
from conformance.port.verify.native import run_native_optax, run_native_torch
from conformance.port.verify.traces import compare, gradient_stream, run_snippet
from conformance.port.write.optax_code import optax_code
from conformance.port.write.torch_code import torch_code
from conformance.rules.groups import group_base_lrs, resolve_groups

DOC = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
F64 = {"precision": {"dtype": "float64"}}


def blocks() -> dict[tuple[str, str], str]:
    text = DOC.read_text()
    found = re.findall(r"<!-- (port-\w): ([\w-]+) -->\n```\w*\n(.*?)```", text, re.S)
    return {(port, kind): code for port, kind, code in found}


def native(port: str) -> dict:
    ns: dict = {}
    with float64_default():  # float64 parameters, so that the comparison is at float64 tolerance
        exec(blocks()[(port, "torch")], ns)  # noqa: S102 - the page's own example
    return ns


def doc_spec(port: str) -> dict:
    return tomllib.loads(blocks()[(port, "spec")])


def test_the_page_has_every_worked_port() -> None:
    assert set(blocks()) == {("port-a", "torch"), ("port-a", "spec"), ("port-b", "torch"), ("port-b", "spec"),
                             ("port-b", "optax-excerpt"), ("port-c", "optax"), ("port-c", "spec")}


def _jax_update_path(config, params: dict, windows: list) -> list[dict]:
    """twinstep's JAX update path on the built-in mlp (= the page's torch model) with cross-entropy."""
    from ref_jax import _update, optimizers
    from ref_jax import models as jm
    from ref_jax import precision as jp
    from ref_jax._schedules import build_scheduler
    from ref_jax._window import stack_window
    from ref_jax.losses import compute_loss

    model = jm.build_model(config.model, None, dtype="float64")
    apply = jm.functional(model)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    tx = optimizers.build_optimizer(config.optimizer, p)
    lrs = build_scheduler(config.schedule, group_base_lrs(config.optimizer)).lr
    specs = _update.UpdateSpecs(config.accumulation, config.clip, config.precision)
    step = jax.jit(_update.make_update_step(specs, tx, lambda q, mb: compute_loss(config.loss, apply(q, mb["x"]),
                                                                                  mb["y"])))
    state = _update.UpdateState(p, tx.init(p), jp.init_scale_state(config.precision), jp.init_skip_state())
    out = []
    for t, window in enumerate(windows):
        hyper = [{"lr": jnp.asarray(float(fn(t)))} for fn in lrs]
        laid = stack_window([{"x": x, "y": y} for x, y in window], None, config.accumulation.steps, np.float64)
        state, _ = step(state, laid, None, hyper)
        out.append({k: np.asarray(v) for k, v in state.params.items()})
    return out


def test_port_a_adamw_warmup_cosine_clip_accumulation_torch_to_jax() -> None:
    ns = native("port-a")
    spec = from_torch(ns["optimizer"], ns["scheduler"], ns["model"])
    want = doc_spec("port-a")
    assert dict(spec) == {k: v for k, v in want.items() if k in ("optimizer", "schedule")}
    assert want["clip"] == {"max_norm": ns["MAX_NORM"]} and want["accumulation"] == {"steps": ns["ACCUMULATE"]}
    config = load_config({**want, **F64, "model": {"name": "mlp", "in_features": 20, "out_features": 2}})
    params = {k: p.detach().numpy().copy() for k, p in ns["model"].named_parameters()}
    rng = np.random.default_rng(0)
    windows = [[(rng.normal(size=(8, 20)), rng.integers(0, 2, size=8)) for _ in range(4)] for _ in range(6)]
    torch_params = []
    for window in windows:
        ns["update"]([(torch.tensor(x), torch.tensor(y)) for x, y in window], torch.nn.functional.cross_entropy)
        torch_params.append({k: p.detach().numpy().copy() for k, p in ns["model"].named_parameters()})
    with Backend("jax").context():
        got = _jax_update_path(config, params, windows)
    for t, (g, w) in enumerate(zip(got, torch_params)):
        for k in w:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-10, atol=1e-12, err_msg=f"update {t} {k}")
    groups = resolve_groups(config.optimizer, {k: v.shape for k, v in params.items()})
    assert groups[0].names == ("0.bias", "2.weight", "2.bias", "3.bias")  # no decay: biases and the LayerNorm


def test_port_b_sgd_nesterov_onecycle_torch_to_optax_snippet() -> None:
    ns = native("port-b")
    named = dict(ns["model"].named_parameters())
    spec = from_torch(ns["optimizer"], ns["scheduler"], named)
    assert dict(spec) == doc_spec("port-b")
    config = load_config({**spec, **F64})
    code = optax_code(config, "b.toml")
    for line in blocks()[("port-b", "optax-excerpt")].splitlines():
        assert line.strip() in code, line
    values = {k: p.detach().numpy().copy() for k, p in named.items()}
    windows = gradient_stream({k: v.shape for k, v in values.items()}, 12, scale=0.1)
    with Backend("jax").context():
        got = run_snippet("optax", code, config, values, windows)
    want = run_native_torch(ns["optimizer"], ns["scheduler"], named, windows)
    err, message = compare(got, want)
    assert message is None, message


def test_port_c_rmsprop_from_optax_to_torch_snippet(tmp_path, capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text(blocks()[("port-c", "optax")])
    spec = from_optax(path)
    assert spec == doc_spec("port-c")
    assert main(["port", str(path), "--to", "spec"]) == 0
    assert tomllib.loads(capsys.readouterr().out) == doc_spec("port-c")
    config = load_config({**spec, **F64})
    code = torch_code(config, "c.toml")
    assert "class RMSpropEpsInSqrt" in code and "import twinstep" not in code
    shapes = {"0.weight": (4, 3), "0.bias": (4,), "1.weight": (2, 4)}
    values = {k: np.random.default_rng(1).normal(size=s) for k, s in shapes.items()}
    windows = gradient_stream(shapes, 10, scale=3.0)  # large enough for the clip to act
    with Backend("jax").context():
        want = run_native_optax(tomllib.loads(blocks()[("port-c", "optax")])["optax"], values, windows)
    got = run_snippet("torch", code, config, values, windows)
    err, message = compare(got, want)
    assert message is None, message
    assert tomlio.dumps(spec).startswith("[optimizer]")


@pytest.mark.parametrize("port", ["port-a", "port-b", "port-c"])
def test_every_printed_spec_is_a_valid_config(port: str) -> None:
    load_config({**doc_spec(port), "model": ModelSpec(name="mlp", in_features=20, out_features=2).model_dump()})
