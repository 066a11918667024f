"""Mixed precision: dtype policy, matmul precision, dynamic loss scaling, the non-finite policy.

The update-level order (docs/contract.md §2): unscaled before clipping, because the clip threshold
is in the gradients' true scale, and checked before the step, so a non-finite update changes nothing:

    scale_loss → backward (accumulation) → unscale_grads (finite check) → clip → optimizer step,
    or skip (parameters and optimizer state untouched) → update_scale → schedule step or hold

Dynamic loss scaling is torch.amp.GradScaler's state machine on a neutral LossScaleState
(scale: float32 scalar, growth_tracker: int32 scalar); see conformance.oracle.precision for the
equations. Checkpoints store it as {"scale": float, "growth_tracker": int} (scale_state_to_dict).
An update is non-finite when the loss or any *unscaled* gradient element is NaN/inf.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from conformance.config.precision import PrecisionSpec
from conformance.errors import InputError
from conformance.rules.loss_scale import require_dynamic_scaling
from conformance.rules.nonfinite import check_nonfinite as check_policy
from ref_jax._trees import named_leaves
from ref_jax.backend import framework_dtype

__all__ = [
    "LossScaleState", "LossScaler", "Policy", "SkipState", "autocast", "check_nonfinite", "finite_flags",
    "get_policy", "grads_finite", "init_scale_state", "init_skip_state", "loss_scale_trace",
    "numerics_context", "record_update", "scale_loss", "scale_state_from_dict", "scale_state_to_dict",
    "unscale_grads", "update_scale",
]


def _map_floating(tree: Any, dtype: Any) -> Any:
    def cast(x: Any) -> Any:
        return x.astype(dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x

    return jax.tree.map(cast, tree)


def _wide() -> Any:
    # GradScaler does its scalar arithmetic in float64; without x64 JAX has float32 only
    return jnp.float64 if jax.dtypes.canonicalize_dtype(jnp.float64) == jnp.float64 else jnp.float32


class Policy(NamedTuple):
    """Dtypes of mixed precision: parameters (master weights and optimizer state), forward compute,
    model outputs. Only floating-point arrays are cast."""

    param_dtype: Any
    compute_dtype: Any
    output_dtype: Any

    def cast_to_param(self, tree: Any) -> Any:
        """Cast the floating arrays of a pytree to the parameter dtype."""
        return _map_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree: Any) -> Any:
        """Cast the floating arrays of a pytree to the compute dtype."""
        return _map_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        """Cast the floating arrays of a pytree to the output dtype."""
        return _map_floating(tree, self.output_dtype)


def get_policy(spec: PrecisionSpec) -> Policy:
    """The dtype policy of a [precision] spec (master float32/float64, compute `dtype`)."""
    return Policy(framework_dtype(spec.param_dtype), framework_dtype(spec.compute_dtype),
                  framework_dtype(spec.output_dtype))


@contextlib.contextmanager
def numerics_context(spec: PrecisionSpec) -> Iterator[None]:
    """Matmul precision for the whole update (forward and backward): TF32 when spec.allow_tf32, else
    full float32 (torch: allow_tf32 flags and float32_matmul_precision; JAX: default_matmul_precision
    "tensorfloat32" or "float32", plus 64-bit types for float64 runs). Restores the previous settings."""
    with contextlib.ExitStack() as stack:
        if spec.dtype == "float64":
            stack.enter_context(jax.enable_x64(True))
        stack.enter_context(jax.default_matmul_precision("tensorfloat32" if spec.allow_tf32 else "float32"))
        yield


def autocast(spec: PrecisionSpec, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """The context for the forward pass and loss: torch.autocast to the compute dtype when it is
    bfloat16/float16 (off otherwise). JAX has no autocast: models apply get_policy(spec) explicitly,
    so there it is a no-op."""
    del spec, device_type
    return contextlib.nullcontext()


class LossScaleState(NamedTuple):
    """Dynamic loss-scale state, as GradScaler's: `scale` (float32 scalar) and `growth_tracker`
    (int32 scalar: finite updates in a row since the scale last changed)."""

    scale: Any
    growth_tracker: Any


def _put(x: Any, device: Any) -> Any:
    return x if device is None else jax.device_put(x, device)


def init_scale_state(spec: PrecisionSpec, device: Any = None) -> LossScaleState:
    """The initial state: scale = float32(spec.init_scale) (1.0 without dynamic scaling), tracker 0."""
    init = spec.init_scale if spec.dynamic_scaling else 1.0
    return LossScaleState(_put(jnp.asarray(init, jnp.float32), device),
                          _put(jnp.zeros((), jnp.int32), device))


def scale_state_to_dict(state: LossScaleState) -> dict[str, Any]:
    """The neutral, JSON-able checkpoint form: {"scale": float, "growth_tracker": int}."""
    return {"scale": float(state.scale), "growth_tracker": int(state.growth_tracker)}


def scale_state_from_dict(data: Mapping[str, Any], device: Any = None) -> LossScaleState:
    """Rebuild a state from scale_state_to_dict's form (GradScaler.state_dict()'s is accepted too)."""
    tracker = data.get("growth_tracker", data.get("_growth_tracker"))
    if "scale" not in data or tracker is None:
        raise InputError("loss-scale state needs 'scale' and 'growth_tracker'; received keys "
                         f"{sorted(data)}")
    return LossScaleState(_put(jnp.asarray(float(data["scale"]), jnp.float32), device),
                          _put(jnp.asarray(int(tracker), jnp.int32), device))


def scale_loss(state: LossScaleState, loss: Any) -> Any:
    """The loss multiplied by the scale (GradScaler.scale)."""
    return loss * state.scale.astype(loss.dtype)


def _inverse(scale: Any) -> Any:
    # float32(1 / float64(scale)); a float32 reciprocal rounds identically (double rounding is
    # innocuous for division when 53 >= 2·24 + 2), so the no-x64 path is exact too
    return (1.0 / scale.astype(_wide())).astype(jnp.float32)


def _all_finite(tree: Any) -> Any:
    leaves = jax.tree.leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else jnp.asarray(True)


def unscale_grads(state: LossScaleState, grads: Any) -> tuple[Any, Any]:
    """Multiply gradients by float32(1 / float64(scale)) and check them: returns (gradients, finite),
    finite a boolean scalar that is False if any unscaled element is NaN/inf. torch unscales the
    given tensors in place (pass {name: p.grad}); JAX returns new arrays."""
    inv = _inverse(state.scale)

    def unscale(g: Any) -> Any:
        work = jnp.promote_types(g.dtype, jnp.float32)  # GradScaler multiplies half grads in float32
        return (g.astype(work) * inv.astype(work)).astype(g.dtype)

    out = jax.tree.map(unscale, grads)
    return out, _all_finite(out)


def grads_finite(grads: Any) -> Any:
    """A boolean scalar: every gradient element is finite (no unscaling)."""
    return _all_finite(grads)


def update_scale(spec: PrecisionSpec, state: LossScaleState, finite: Any) -> LossScaleState:
    """GradScaler.update on a state: back off after a non-finite update, grow after growth_interval
    finite ones (see the module docstring). Returns a new state; unchanged without dynamic scaling."""
    if not spec.dynamic_scaling:
        return state
    finite = jnp.asarray(finite, bool)
    wide = state.scale.astype(_wide())
    grown = (wide * spec.growth_factor).astype(jnp.float32)
    backed = (wide * spec.backoff_factor).astype(jnp.float32)
    successful = state.growth_tracker + 1
    at_interval = successful == spec.growth_interval
    kept = jnp.where(jnp.isfinite(grown), grown, state.scale)  # growth is capped where non-finite
    scale = jnp.where(finite, jnp.where(at_interval, kept, state.scale), backed)
    tracker = jnp.where(finite & ~at_interval, successful, 0).astype(jnp.int32)
    return LossScaleState(scale.astype(jnp.float32), tracker)


def finite_flags(loss: Any, grads: Any) -> tuple[Any, dict[str, Any]]:
    """(loss finite, {name: gradient finite}) as boolean scalars, for naming the bad tensor."""
    flags = {name: jnp.all(jnp.isfinite(g)) for name, g in named_leaves(grads)}
    return jnp.all(jnp.isfinite(loss)), flags


class SkipState(NamedTuple):
    """Counters of the non-finite policy: `skipped` (total skipped updates) and `consecutive`
    (skipped updates in a row, 0 after an applied one)."""

    skipped: Any
    consecutive: Any


def init_skip_state() -> SkipState:
    """No update skipped yet."""
    return SkipState(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def record_update(state: SkipState, finite: Any) -> SkipState:
    """Count one update: a non-finite one is skipped (both counters +1), a finite one resets the run."""
    bad = (~jnp.asarray(finite, bool)).astype(jnp.int32)
    return SkipState(state.skipped + bad, jnp.where(bad > 0, state.consecutive + 1, 0).astype(jnp.int32))


def check_nonfinite(spec: PrecisionSpec, state: SkipState, loss_finite: Any, grads_finite: Any,
                    update: int | None = None) -> None:
    """Host-side policy after record_update: NonFiniteError naming the first non-finite tensor (the
    loss, else the first gradient) under on_nonfinite = "raise", or once more than
    max_consecutive_skips updates in a row were skipped. Synchronizes."""
    check_policy(spec, int(state.consecutive), bool(loss_finite),
                            {k: bool(v) for k, v in grads_finite.items()}, update)


class LossScaler:
    """A thin stateful object over the functional core, GradScaler's interface for a loop:
    scale(loss), unscale(grads) -> (grads, finite), update(finite), state_dict()/load_state_dict().
    Without dynamic scaling it is GradScaler(enabled=False): scale is the identity, unscale only checks."""

    def __init__(self, spec: PrecisionSpec, device: Any = None) -> None:
        self.spec = spec
        self.device = device
        self.state = init_scale_state(spec, device)

    @property
    def enabled(self) -> bool:
        return self.spec.dynamic_scaling

    def scale(self, loss: Any) -> Any:
        return scale_loss(self.state, loss) if self.enabled else loss

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        return unscale_grads(self.state, grads) if self.enabled else (grads, grads_finite(grads))

    def update(self, finite: Any) -> None:
        self.state = update_scale(self.spec, self.state, finite)

    def get_scale(self) -> float | None:
        """The scale in force (None when disabled), the `loss_scale` metric."""
        return float(self.state.scale) if self.enabled else None

    def state_dict(self) -> dict[str, Any]:
        return scale_state_to_dict(self.state)

    def load_state_dict(self, data: Mapping[str, Any]) -> None:
        self.state = scale_state_from_dict(data, self.device)


def loss_scale_trace(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict[str, Any]:
    """Run the loss-scale state machine over per-update finite flags.

    Returns {"scale": scale in force at each update, "skipped": per update, "growth_tracker":
    after each update}; raises NonFiniteError per the non-finite policy."""
    if not spec.dynamic_scaling:
        require_dynamic_scaling(spec)
    state, skips = init_scale_state(spec), init_skip_state()
    out: dict[str, list[Any]] = {"scale": [], "skipped": [], "growth_tracker": []}
    for t, ok in enumerate(finite):
        out["scale"].append(float(state.scale))
        out["skipped"].append(not bool(ok))
        flag = jnp.asarray(bool(ok))
        state, skips = update_scale(spec, state, flag), record_update(skips, flag)
        check_policy(spec, int(skips.consecutive), True, {}, update=t, finite=bool(ok))
        out["growth_tracker"].append(int(state.growth_tracker))
    return out
