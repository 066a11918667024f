"""Write clip conformance cases whose expected values come from the frameworks' own clipping.

    python tools/gen_clip_cases.py [OUT_DIR]      # default: conformance/cases/clip/generated

eps = 1e-6 cases (torch's rule): torch.nn.utils.clip_grad_norm_ / clip_grad_value_ (and one
clip_grad_norm_ call per parameter for per_parameter) in float64 (one case in float32); the returned
norm is clip_grad_norm_'s. eps = 0 cases (optax's rule): optax.clip_by_global_norm in float64, with
optax.tree.norm as the norm. Never twinstep's code. Hand-checked seed cases live beside this folder.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conformance import tomlio

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "clip" / "generated"
TORCH = f"torch {torch.__version__.split('+')[0]}"
rng = np.random.default_rng(20261205)
GradSet = dict[str, np.ndarray]


def grads(scale: float = 1.0) -> GradSet:
    return {"w": np.round(rng.normal(size=(2, 3)) * scale, 4), "b": np.round(rng.normal(size=(3,)) * scale, 4)}


def torch_clip(g: GradSet, clip: dict[str, Any], dtype=torch.float64) -> tuple[GradSet, float]:
    """Run torch's built-in on parameters holding `g`; return (clipped grads, returned norm)."""
    params = []
    for v in g.values():
        p = torch.nn.Parameter(torch.zeros(v.shape, dtype=dtype))
        p.grad = torch.tensor(v, dtype=dtype)
        params.append(p)
    p_type = clip.get("norm_type", 2.0)
    p_type = math.inf if p_type == "inf" else p_type
    if "clip_value" in clip and "max_norm" in clip:  # the two calls a torch user writes, value first
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], p_type)  # logged: before any clipping
        torch.nn.utils.clip_grad_value_(params, clip["clip_value"])
        for group in ([p] for p in params) if clip.get("per_parameter") else [params]:
            torch.nn.utils.clip_grad_norm_(group, clip["max_norm"], p_type)
    elif "clip_value" in clip:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], p_type)
        torch.nn.utils.clip_grad_value_(params, clip["clip_value"])
    elif clip.get("per_parameter"):
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], p_type)
        for p in params:
            torch.nn.utils.clip_grad_norm_([p], clip["max_norm"], p_type)
    elif "max_norm" in clip:
        norm = torch.nn.utils.clip_grad_norm_(params, clip["max_norm"], p_type)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], p_type)
    out = {k: p.grad.double().numpy() for k, p in zip(g, params)}
    return out, float(norm)


def optax_clip(g: GradSet, max_norm: float, clip_value: float | None = None) -> tuple[GradSet, float]:
    import jax
    import jax.numpy as jnp
    import optax

    with jax.enable_x64(True):
        tree = {k: jnp.asarray(v, jnp.float64) for k, v in g.items()}
        tx = optax.clip_by_global_norm(max_norm)
        if clip_value is not None:  # by value first, as the spec's clip_value with max_norm
            tx = optax.chain(optax.clip(clip_value), tx)
        out, _ = tx.update(tree, tx.init(tree))
        norm = float(optax.tree.norm(tree))
        return {k: np.asarray(v, np.float64) for k, v in out.items()}, norm


def write(name: str, body: dict[str, Any], out: Path) -> None:
    case = {"id": f"clip/{name}", "kind": "clip", **body}
    (out / f"{name}.toml").write_text(tomlio.dumps(case))


def torch_case(name: str, g: GradSet, clip: dict[str, Any], out: Path, desc: str, dtype: str = "float64") -> None:
    tdt = {"float64": torch.float64, "float32": torch.float32}[dtype]
    if dtype != "float64":
        g = {k: v.astype(np.float32).astype(np.float64) for k, v in g.items()}
    clipped, norm = torch_clip(g, clip, tdt)
    call = ("clip_grad_value_ then clip_grad_norm_ (the norm returned: get_total_norm before both)"
            if "clip_value" in clip and "max_norm" in clip else
            "clip_grad_value_" if "clip_value" in clip else
            "clip_grad_norm_ per parameter" if clip.get("per_parameter") else
            "clip_grad_norm_" if "max_norm" in clip else "get_total_norm")
    body: dict[str, Any] = {
        "source": f"{TORCH} torch.nn.utils.{call} in {dtype} (tools/gen_clip_cases.py)",
        "description": desc, "clip": clip, "inputs": {"grads": g},
        "expected": {"grads": clipped, "total_norm": norm},
    }
    if dtype != "float64":
        body = {"dtype": dtype, **body}
    write(name, body, out)


def optax_case(name: str, g: GradSet, max_norm: float, out: Path, desc: str, exact: bool = False,
               clip_value: float | None = None) -> None:
    clipped, norm = optax_clip(g, max_norm, clip_value)
    import optax

    chain = "optax.chain(optax.clip, optax.clip_by_global_norm)" if clip_value is not None else "optax.clip_by_global_norm"
    spec = {"max_norm": max_norm, "eps": 0.0, **({"clip_value": clip_value} if clip_value is not None else {})}
    body: dict[str, Any] = {
        "source": f"optax {optax.__version__} {chain} in float64, norm from optax.tree.norm"
                  f"{' of the unclipped gradients' if clip_value is not None else ''} (tools/gen_clip_cases.py)",
        "description": desc, "clip": spec, "inputs": {"grads": g},
        "expected": {"grads": clipped, "total_norm": norm},
    }
    if exact:
        body["tolerance"] = {"atol": 0.0, "rtol": 0.0}
    write(name, body, out)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    big = grads(2.0)
    torch_case("global-norm-above", big, {"max_norm": 1.0}, out,
               "norm above max_norm: scaled by 1/(norm + 1e-6), slightly below max_norm")
    torch_case("global-norm-below-noop", grads(0.05), {"max_norm": 1.0}, out,
               "norm below max_norm: the coefficient clamps to 1 and the gradients are unchanged")
    torch_case("exact-threshold-torch", {"w": np.array([3.0, 4.0])}, {"max_norm": 5.0}, out,
               "norm exactly max_norm: torch still scales by 5/(5 + 1e-6) (optax does not)")
    optax_case("exact-threshold-optax", {"w": np.array([3.0, 4.0])}, 5.0, out,
               "norm exactly max_norm with eps = 0: optax's `>=` select returns (g / 5) * 5", exact=True)
    optax_case("optax-above-bitwise", {"w": np.array([2.0, 3.0, 6.0]), "b": np.array([24.0])}, 10.0, out,
               "eps = 0 above the threshold: (g / 25) * 10 bit for bit (norms 7 and 24 give 25 exactly)",
               exact=True)
    optax_case("optax-below-noop", grads(0.05), 1.0, out, "eps = 0 below the threshold: untouched")
    small = {"w": np.array([3e-3, 4e-3])}
    torch_case("small-norm-eps-gap-torch", small, {"max_norm": 1e-3}, out,
               "norm 5e-3, max 1e-3: torch's 1e-6 leaves the clipped norm at 0.0009998 (-2e-4 relative)")
    optax_case("small-norm-eps-gap-optax", small, 1e-3, out,
               "the same gradients with eps = 0: the clipped norm is exactly 1e-3 (goodfire-ai/spd#643)")
    torch_case("inf-norm", big, {"max_norm": 0.5, "norm_type": "inf"}, out, "norm_type = inf: max |g|")
    torch_case("p3-norm", big, {"max_norm": 0.5, "norm_type": 3.0}, out, "a p-norm: (sum |g|^3)^(1/3)")
    torch_case("p1-norm", big, {"max_norm": 0.5, "norm_type": 1.0}, out, "the 1-norm")
    torch_case("per-parameter", big, {"max_norm": 0.7, "per_parameter": True}, out,
               "each parameter clipped to its own norm; the returned norm is the global one")
    torch_case("value", big, {"clip_value": 0.5}, out, "clamp to [-0.5, 0.5]; the norm is logged unclipped")
    torch_case("norm-only", big, {}, out, "no clipping: gradients untouched, norm still returned")
    torch_case("float32-global-norm", grads(3.0), {"max_norm": 1.0}, out, "the same rule in float32",
               dtype="float32")
    bad = {"w": np.array([1.0, math.inf, -2.0]), "b": np.array([0.5])}
    torch_case("inf-gradient", bad, {"max_norm": 1.0}, out,
               "an inf gradient: the norm is inf, finite entries become 0 and the inf entry NaN")
    nan = {"w": np.array([1.0, math.nan]), "b": np.array([0.5])}
    torch_case("nan-gradient", nan, {"max_norm": 1.0}, out, "a NaN gradient makes every gradient NaN")
    spiky = {"w": np.array([[0.2, -3.0, 0.1], [0.4, 0.05, 2.5]]), "b": np.array([-0.3, 0.6, 0.1])}
    torch_case("value-then-norm", spiky, {"clip_value": 0.5, "max_norm": 0.8}, out,
               "clip_grad_value_(0.5) then clip_grad_norm_(0.8): the norm rule sees the clamped gradients "
               "(norm 1.08, not 4.0); the logged norm is the one before both")
    torch_case("value-then-norm-per-parameter", spiky, {"clip_value": 0.5, "max_norm": 0.6, "per_parameter": True}, out,
               "clamped, then each parameter clipped to its own norm")
    torch_case("value-then-norm-below", spiky, {"clip_value": 0.5, "max_norm": 5.0}, out,
               "clamped below max_norm: the norm rule multiplies by 5 / (n + 1e-6) clamped to 1")
    optax_case("value-then-norm-optax", spiky, 0.8, out, "optax.chain(optax.clip(0.5), "
               "optax.clip_by_global_norm(0.8)): eps = 0 after the clamp", clip_value=0.5)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
