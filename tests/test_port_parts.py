"""The optimizer code a `--to torch` snippet carries is ref_torch's own: conformance.port.write.
torch_parts copies each class or function verbatim out of ref_torch's module files (read as text,
nothing imported), with the definitions and imports it needs, so the snippet and twinstep's torch
twin run the same code and cannot diverge under one name.

The property is checked on every snippet the port tests write: each top-level class, function or
assignment a snippet defines under a name ref_torch also defines has exactly the source of the
object ref_torch runs (read back with inspect from the imported twin), and each name it imports is
the object ref_torch's module imports. Negative controls: a snippet whose Lion differs from the
twin's, or one carrying a class of its own under a twin's name, is flagged; a clean one is not.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
from pathlib import Path

import pytest
import torch
from support.processes import PROCESS_S, run_process
from test_port_code import OPTIMIZERS, _config

import ref_torch
from conformance.port.write import torch_parts
from conformance.port.write.torch_code import torch_code

# The snippet's own entry points, written per spec (docs/porting.md): ref_torch's functions of
# these names take a spec and are a different API, not code the snippet copies.
SNIPPET_API = ("build_optimizer", "build_scheduler")
CONFIGS = {**{k: _config(v, no_decay=k.startswith(("adamw", "lion"))) for k, v in OPTIMIZERS.items()
              if not k.startswith("schedule-free")},
           "muon-float32-adamw": _config({"name": "muon", "lr": 0.01, "ns_dtype": "float32",
                                          "fallback": {"name": "adamw", "lr": 0.01}})}
CARRIES = {"lion": ("Lion", "Foreach"), "adam-eps-root": ("AdamVariants",), "rmsprop-decoupled": ("RMSpropEpsInSqrt",),
           "sgd-decoupled": ("DecoupledSGD", "DecoupledDecay"), "nadam": ("_float64_mu_product",),
           "muon-float64": ("FloatMuon", "MuonWithFallback", "newton_schulz"), "muon-bfloat16": ("MuonWithFallback",),
           "ademamix-warmups": ("AdEMAMix", "alpha_at", "beta3_at", "Foreach")}
PIECES = ("Lion", "AdamVariants", "RMSpropEpsInSqrt", "AdagradEpsInSqrt", "FloatMuon", "MuonWithFallback",
          "_float64_mu_product", "DecoupledSGD", "DecoupledRMSprop", "DecoupledAdagrad", "DecoupledAdamax", "AdEMAMix")


def _definitions(text: str) -> dict[str, str]:
    """Top-level class, function and simple assignment texts of a module, by name (decorators kept)."""
    lines, out = text.splitlines(), {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = "\n".join(lines[first - 1:node.end_lineno])
        elif isinstance(node, ast.Assign):
            out.update({t.id: ast.get_source_segment(text, node) for t in node.targets if isinstance(t, ast.Name)})
    return out


@functools.cache
def twin_sources(name: str) -> tuple[str, ...]:
    """The sources ref_torch gives `name`: inspect's for the classes and functions its modules run,
    the statement for an assignment; () where ref_torch defines no such name."""
    found = []
    for path in sorted(Path(ref_torch.__path__[0]).glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if name not in _definitions(text):
            continue
        obj = getattr(importlib.import_module(f"ref_torch.{path.stem}"), name)
        found.append(inspect.getsource(obj).rstrip("\n") if inspect.isclass(obj) or inspect.isfunction(obj)
                     else _definitions(text)[name])
    return tuple(found)


def diverging(snippet: str, reference=twin_sources) -> list[str]:
    """The names the snippet defines that ref_torch also defines, with a text none of ref_torch's is."""
    return sorted(name for name, text in _definitions(snippet).items()
                  if name not in SNIPPET_API and (want := reference(name)) and text not in want)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_twin_name_a_snippet_defines_is_the_twin_s_code(name: str) -> None:
    snippet = torch_code(CONFIGS[name])
    assert diverging(snippet) == []
    assert set(CARRIES.get(name, ())) <= set(_definitions(snippet)), "the twin's classes are carried, not written"


def test_the_check_flags_a_diverging_copy_and_passes_a_clean_snippet() -> None:
    """Negative controls: Lion with another sign step, a template class under a twin's name."""
    snippet = torch_code(CONFIGS["lion"])
    assert "torch._foreach_sign_(direction)" in snippet and diverging(snippet) == []
    assert diverging(snippet.replace("torch._foreach_sign_(direction)", "torch._foreach_tanh_(direction)")) == ["Lion"]
    own = ('class RMSpropEpsInSqrt(torch.optim.Optimizer):\n    """A copy posing as the reference."""\n\n'
           '    def update(self, p, g, state, group):\n        p.add_(g, alpha=-group["lr"])')
    assert diverging(snippet + "\n\n" + own + "\n") == ["RMSpropEpsInSqrt"]
    assert diverging("class NotATwinName:\n    pass\n") == []
    assert diverging(snippet, reference=lambda n: ("something else",) if n == "Foreach" else ()) == ["Foreach"]


def _namespace(names: tuple[str, ...] = PIECES) -> dict:
    """The carried code executed on its own (imports and sources), as a snippet runs it."""
    carried = torch_parts.carried(list(names))
    code = "\n".join([*(f"import {m}" for m in sorted(torch_parts.SNIPPET_IMPORTS)),  # as the snippet's header
                      *torch_parts.import_lines(carried.imports), *carried.sources])
    ns: dict = {"__name__": "carried"}
    exec(compile(code, "carried", "exec"), ns)  # noqa: S102 - the carried code under test
    return ns


def test_carried_imports_bind_what_the_twin_s_modules_import() -> None:
    carried, ns = torch_parts.carried(list(PIECES)), _namespace()
    assert set(carried.imports) >= {"Any", "Optimizer", "_get_scalar_dtype", "_adjust_lr", "Muon"}
    for bound in carried.imports:
        users = [m for m in torch_parts.twin_modules() if bound in torch_parts.module(m).imported]
        assert users and all(ns[bound] is getattr(importlib.import_module(m), bound) for m in users), bound


def test_carrying_reads_text_and_imports_neither_torch_nor_the_twin() -> None:
    code = ("import sys; from conformance.port.write import torch_parts as p; "
            f"c = p.carried({list(PIECES)!r}); assert len(c.sources) > {len(PIECES)}; "
            "bad = [m for m in ('torch', 'ref_torch') if m in sys.modules]; assert not bad, bad")
    run_process([sys.executable, "-c", code], "carry ref_torch's classes", PROCESS_S, check=True)


def test_unknown_names_and_the_source_of_one_definition() -> None:
    assert torch_parts.source("Lion") == twin_sources("Lion")[0]
    with pytest.raises(KeyError, match="defines no top-level class or function 'Adam'"):
        torch_parts.carried(["Adam"])


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


@pytest.fixture(scope="module")
def ns() -> dict:
    return _namespace()


def test_carried_lion_runs_one_step(ns) -> None:
    p0, g = _params()
    got = _one_step(lambda ps: ns["Lion"](ps, lr=0.1, betas=(0.9, 0.99), weight_decay=0.01))
    torch.testing.assert_close(got, p0.detach() * (1 - 0.1 * 0.01) - 0.1 * torch.sign(g), rtol=0, atol=1e-15)


@pytest.mark.parametrize(("name", "theirs", "ours", "moved"), [
    ("AdamVariants", lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.01),
     {"lr": 0.1, "weight_decay": 0.01}, {"eps_root": 1e-3}),
    ("RMSpropEpsInSqrt", lambda ps: torch.optim.RMSprop(ps, lr=0.1, momentum=0.5, centered=True),
     {"lr": 0.1, "momentum": 0.5, "centered": True, "eps_in_sqrt": False}, {"eps_in_sqrt": True, "eps": 1e-3}),
    ("AdagradEpsInSqrt", lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
     {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "eps_in_sqrt": False},
     {"eps_in_sqrt": True, "eps": 1e-3}),
])
def test_carried_option_classes_equal_torch_where_the_semantics_coincide(ns, name, theirs, ours, moved) -> None:
    got = _one_step(lambda ps: ns[name](ps, **ours))
    torch.testing.assert_close(got, _one_step(theirs), rtol=1e-14, atol=1e-15)
    other = _one_step(lambda ps: ns[name](ps, **{**ours, **moved}))
    assert torch.isfinite(other).all() and not torch.equal(other, got)  # the optax option changes the step


def test_carried_float_muon_and_the_fallback_run_one_step(ns) -> None:
    want = _one_step(lambda ps: torch.optim.Muon(ps, lr=0.1))  # Newton–Schulz in bfloat16
    got = _one_step(lambda ps: ns["FloatMuon"](ps, lr=0.1))  # float32
    p0, _ = _params()
    # the same step up to bfloat16's rounding of the Newton–Schulz iterate (measured 2.8e-3 of lr 0.1)
    torch.testing.assert_close(got - p0.detach(), want - p0.detach(), rtol=0, atol=0.1 * 0.05)
    mat, mat_g = _params(1)
    vec, vec_g = _params(2, (4,))
    groups = [{"params": [mat], "use_muon": True, "lr": 0.1}, {"params": [vec], "use_muon": False, "lr": 0.1}]
    opt = ns["MuonWithFallback"](groups, ns["FloatMuon"], torch.optim.SGD)
    mat.grad, vec.grad = mat_g.clone(), vec_g.clone()
    opt.step()
    torch.testing.assert_close(mat.detach(), _one_step(lambda ps: ns["FloatMuon"](ps, lr=0.1), seed=1), rtol=0, atol=0)
    torch.testing.assert_close(vec.detach(), _one_step(lambda ps: torch.optim.SGD(ps, lr=0.1), 2, (4,)), rtol=0, atol=0)


def test_the_carried_nadam_hook_keeps_mu_product_in_float64(ns) -> None:
    p, g = _params()
    opt = torch.optim.NAdam([p], lr=0.1)
    opt.register_step_pre_hook(ns["_float64_mu_product"])
    p.grad = g
    opt.step()
    assert opt.state[p]["mu_product"].dtype == torch.float64 and torch.isfinite(p).all()


def test_carried_decoupled_sgd_is_adamw_s_decay_before_the_step(ns) -> None:
    p0, g = _params()
    got = _one_step(lambda ps: ns["DecoupledSGD"]([{"params": ps, "decoupled_weight_decay": True}], lr=0.5,
                                                  weight_decay=0.1))
    torch.testing.assert_close(got, p0.detach() * (1 - 0.5 * 0.1) - 0.5 * g, rtol=0, atol=1e-15)
