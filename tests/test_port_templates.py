"""conformance/port/write/templates/torch_optimizers.py, the source the `--to torch` snippets copy
their optimizer classes from: it ships as package data, compiles as a module of its own, every class
runs one step (equal to torch.optim's own class where the spec's semantics coincide) and every
piece the snippets copy is one of its top-level classes or functions."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
import torch

from conformance.port.write import torch_parts

ROOT = Path(__file__).resolve().parents[1]
PIECES = ("PerParameter", "Lion", "AdamOptax", "RMSpropEpsInSqrt", "AdagradEpsInSqrt", "FloatMuon",
          "MuonWithFallback", "float64_mu_product", "decoupled_decay")


@pytest.fixture(scope="module")
def ns() -> dict:
    """The template executed as a module of its own (twinstep never imports it)."""
    text = torch_parts.template_text()
    namespace: dict = {"__name__": "torch_optimizers_template"}
    exec(compile(text, "templates/torch_optimizers.py", "exec"), namespace)  # noqa: S102 - the template under test
    return namespace


def test_the_template_ships_as_package_data_and_is_never_imported() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "port/write/templates/*.py" in data["conformance"]
    assert not (ROOT / "conformance/port/write/templates/__init__.py").exists()
    for path in (ROOT / "conformance").rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not any("templates" in m for m in imported), path


def test_every_piece_is_a_top_level_definition() -> None:
    tree = ast.parse(torch_parts.template_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert set(PIECES) == defined
    for name in PIECES:
        piece = torch_parts.source(name)
        assert piece.startswith(("class ", "def ")) and piece == piece.strip("\n")
        compile(piece, name, "exec")
    with pytest.raises(KeyError, match="no class or function 'Adam'"):
        torch_parts.source("Adam")


def _params(seed: int = 0, shape: tuple[int, ...] = (3, 4)) -> tuple[torch.nn.Parameter, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen, dtype=torch.float64))
    return p, torch.randn(shape, generator=gen, dtype=torch.float64)


def _one_step(make, seed: int = 0, shape: tuple[int, ...] = (3, 4)) -> torch.Tensor:
    p, g = _params(seed, shape)
    opt = make([p])
    p.grad = g.clone()
    opt.step()
    return p.detach().clone()


def test_lion_runs_one_step(ns) -> None:
    p0, g = _params()
    got = _one_step(lambda ps: ns["Lion"](ps, lr=0.1, betas=(0.9, 0.99), weight_decay=0.01))
    torch.testing.assert_close(got, p0.detach() * (1 - 0.1 * 0.01) - 0.1 * torch.sign(g), rtol=0, atol=1e-15)


@pytest.mark.parametrize(("name", "theirs", "ours"), [
    ("AdamOptax", lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.01),
     {"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "decoupled_weight_decay": False,
      "amsgrad": False, "amsgrad_variant": "torch", "eps_root": 0.0}),
    ("RMSpropEpsInSqrt", lambda ps: torch.optim.RMSprop(ps, lr=0.1, momentum=0.5, centered=True),
     {"lr": 0.1, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.5, "centered": True,
      "eps_in_sqrt": False}),
    ("AdagradEpsInSqrt", lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
     {"lr": 0.1, "lr_decay": 0.01, "eps": 1e-10, "weight_decay": 0.0, "initial_accumulator_value": 0.1,
      "eps_in_sqrt": False}),
])
def test_optax_option_classes_equal_torch_where_the_semantics_coincide(ns, name, theirs, ours) -> None:
    got = _one_step(lambda ps: ns[name](ps, **ours))
    torch.testing.assert_close(got, _one_step(theirs), rtol=1e-14, atol=1e-15)
    moved = _one_step(lambda ps: ns[name](ps, **{**ours, "eps_root": 1e-3} if name == "AdamOptax"
                                          else {**ours, "eps_in_sqrt": True, "eps": 1e-3}))
    assert torch.isfinite(moved).all() and not torch.equal(moved, got)  # the optax option changes the step


def test_float_muon_and_the_fallback_run_one_step(ns) -> None:
    want = _one_step(lambda ps: torch.optim.Muon(ps, lr=0.1))  # Newton–Schulz in bfloat16
    got = _one_step(lambda ps: ns["FloatMuon"](ps, lr=0.1))  # NS_DTYPE float32
    p0, _ = _params()
    # the same step up to bfloat16's rounding of the Newton–Schulz iterate (measured 2.8e-3 of lr 0.1)
    torch.testing.assert_close(got - p0.detach(), want - p0.detach(), rtol=0, atol=0.1 * 0.05)
    mat, mat_g = _params(1)
    vec, vec_g = _params(2, (4,))
    groups = [{"params": [mat], "use_muon": True, "lr": 0.1}, {"params": [vec], "use_muon": False, "lr": 0.1}]
    opt = ns["MuonWithFallback"](groups, torch.optim.SGD, ns["FloatMuon"])
    mat.grad, vec.grad = mat_g.clone(), vec_g.clone()
    opt.step()
    torch.testing.assert_close(mat.detach(), _one_step(lambda ps: ns["FloatMuon"](ps, lr=0.1), seed=1), rtol=0, atol=0)
    torch.testing.assert_close(vec.detach(), _one_step(lambda ps: torch.optim.SGD(ps, lr=0.1), 2, (4,)), rtol=0, atol=0)


def test_the_nadam_hook_keeps_mu_product_in_float64(ns) -> None:
    p, g = _params()
    opt = torch.optim.NAdam([p], lr=0.1)
    opt.register_step_pre_hook(ns["float64_mu_product"])
    p.grad = g
    opt.step()
    assert opt.state[p]["mu_product"].dtype == torch.float64 and torch.isfinite(p).all()


def test_decoupled_decay_is_adamw_s_decay_before_the_step(ns) -> None:
    """The pre-hook on torch.optim.SGD (weight_decay 0, decoupled_decay wd) is torch's Adam(W) decay:
    p·(1 − lr·wd) before the step."""
    p0, g = _params()
    got = _one_step(lambda ps: _hooked(torch.optim.SGD([{"params": ps, "decoupled_decay": 0.1}], lr=0.5), ns))
    torch.testing.assert_close(got, p0.detach() * (1 - 0.5 * 0.1) - 0.5 * g, rtol=0, atol=1e-15)


def _hooked(opt, ns):
    opt.register_step_pre_hook(ns["decoupled_decay"])
    return opt
