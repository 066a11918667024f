"""The whole update-level path on the CPU, torch and JAX, against seed 000's loop on torch built-ins:

    scale → backward over the window → unscale → non-finite check → clip → AdamW step or skip →
    scaler update → schedule step or hold

The reference (`seed_loop`) uses only torch.amp.GradScaler("cpu"), clip_grad_norm_, AdamW, StepLR and
F.cross_entropy, in seed 000's order with its remainder correction. Overflows are injected by
multiplying chosen windows' losses by inf.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

from conformance.config.accumulation import AccumulationSpec
from conformance.config.clip import ClipSpec
from conformance.config.loss import LossSpec
from conformance.config.precision import PrecisionSpec
from conformance.errors import NonFiniteError
from ref_jax import _update as jupd
from ref_jax import accumulation as ja
from ref_jax import losses as jl
from ref_jax import precision as jp
from ref_jax._window import stack_window
from ref_torch import _update as tupd
from ref_torch import accumulation as ta
from ref_torch import losses as tl
from ref_torch import precision as tp

CE = LossSpec(name="cross_entropy")
STEPS, LR, WD, MAX_NORM, GAMMA = 3, 0.1, 0.01, 0.5, 0.5
POISON = {1, 4}  # windows whose loss is multiplied by inf


def make_data(n_micro: int = 17, rows: int = 4, seed: int = 0) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(seed)
    params = {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=4) * 0.1}
    batches = [{"x": rng.normal(size=(rows, 3)), "y": rng.integers(0, 4, size=rows)} for _ in range(n_micro)]
    for b in batches[::3]:
        b["y"][0] = -100  # unequal valid counts
    return params, batches


def windows(batches: list, steps: int = STEPS) -> list[list]:
    return [batches[i:i + steps] for i in range(0, len(batches), steps)]


def counts_of(window: list[dict]) -> list[float]:
    return [float((mb["y"] != -100).sum()) for mb in window]


def jax_window(window: list[dict], counts: list[float] | None = None, dtype=np.float64, **per_batch) -> dict:
    """A window of NumPy micro-batches laid out for the JAX loop (ref_jax._window.stack_window),
    each micro-batch with the extra entries `per_batch` (e.g. its loss factor)."""
    batches = [{"x": np.asarray(mb["x"], dtype), "y": mb["y"], **per_batch} for mb in window]
    return stack_window(batches, counts, STEPS, dtype)


def step_lr(position: int) -> float:
    return LR * GAMMA ** (position // 2)  # StepLR(step_size=2, gamma=0.5), torch's closed form


def seed_loop(params0: dict, batches: list, precision: PrecisionSpec, normalize: str, poison=POISON,
              fused: bool = False) -> dict:
    """seed 000 §PyTorch 训练循环 on torch built-ins (float64); tokens: Σ sum / N_window by hand.
    fused: AdamW's fused kernel, which GradScaler.step hands its found_inf."""
    params = [torch.nn.Parameter(torch.tensor(params0[k])) for k in ("w", "b")]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WD, fused=fused)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=GAMMA)
    scaler = torch.amp.GradScaler("cpu", init_scale=precision.init_scale, growth_interval=precision.growth_interval)
    trace: dict[str, list] = {"params": [], "skipped": [], "scale": [], "norm": [], "lr": []}
    for t, window in enumerate(windows(batches)):
        opt.zero_grad(set_to_none=True)
        total = sum(counts_of(window))
        for mb in window:
            logits = torch.tensor(mb["x"]) @ params[0] + params[1]
            y = torch.tensor(mb["y"])
            raw = F.cross_entropy(logits, y, reduction="sum") / total if normalize == "tokens" else \
                F.cross_entropy(logits, y) / STEPS
            scaler.scale(raw * (math.inf if t in poison else 1.0)).backward()
        if normalize == "micro_batches" and len(window) != STEPS:
            for p in params:
                p.grad.mul_(STEPS / len(window))  # seed 000's remainder correction
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=MAX_NORM)
        scale = scaler.get_scale()
        trace["lr"].append(opt.param_groups[0]["lr"])
        scaler.step(opt)
        scaler.update()
        skipped = scaler.get_scale() < scale  # HF's test: the scale backed off
        if precision.schedule_advances(skipped):
            sched.step()
        trace["params"].append({k: p.detach().numpy().copy() for k, p in zip(("w", "b"), params)})
        trace["skipped"].append(skipped)
        trace["scale"].append(scale)
        trace["norm"].append(float(norm))
    return trace


def _specs(precision: PrecisionSpec, normalize: str, mod) -> object:
    return mod.UpdateSpecs(AccumulationSpec(steps=STEPS, normalize=normalize), ClipSpec(max_norm=MAX_NORM), precision)


def new_trace() -> dict[str, list]:
    return {"params": [], "skipped": [], "scale": [], "norm": [], "lr": [], "opt_state": []}


def run_torch(params0: dict, batches: list, precision: PrecisionSpec, normalize: str, poison=POISON,
              trace: dict | None = None, fused: bool = False) -> dict:
    dt = getattr(torch, precision.param_dtype)
    params = {k: torch.nn.Parameter(torch.tensor(v, dtype=dt)) for k, v in params0.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=LR, weight_decay=WD, fused=fused)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=GAMMA)
    scaler, skips = tp.LossScaler(precision), tp.init_skip_state()
    specs = _specs(precision, normalize, tupd)
    trace = new_trace() if trace is None else trace
    for t, window in enumerate(windows(batches)):
        factor = math.inf if t in poison else 1.0

        def loss_fn(p, mb, factor=factor):
            with tp.autocast(precision, "cpu"):
                out = tl.compute_loss(CE, ta.linear_forward(p, mb["x"]), mb["y"])
            return tl.LossOutput(out.value * factor, out.sum * factor, out.count)

        trace["lr"].append(opt.param_groups[0]["lr"])
        tensors = [{"x": torch.tensor(mb["x"], dtype=dt), "y": torch.tensor(mb["y"])} for mb in window]
        with tp.numerics_context(precision):
            skips, info = tupd.apply_update(specs, params, opt, sched, scaler, skips, loss_fn, tensors,
                                            counts_of(window), update=t)
        trace["params"].append({k: p.detach().double().numpy().copy() for k, p in params.items()})
        trace["opt_state"].append({k: v.clone() for s in opt.state.values() for k, v in s.items()})
        for key, value in (("skipped", info.skipped), ("scale", info.loss_scale), ("norm", info.grad_norm)):
            trace[key].append(value)
    return trace


def run_jax(params0: dict, batches: list, precision: PrecisionSpec, normalize: str, poison=POISON,
            trace: dict | None = None) -> dict:
    policy = jp.get_policy(precision)

    def loss_fn(p, mb):
        logits = ja.linear_forward(policy.cast_to_compute(p), mb["x"].astype(policy.compute_dtype))
        out = jl.compute_loss(CE, policy.cast_to_output(logits), mb["y"])
        return jl.LossOutput(out.value * mb["poison"], out.sum * mb["poison"], out.count)

    specs = _specs(precision, normalize, jupd)
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=LR, weight_decay=WD)
    params = {k: jnp.asarray(v, policy.param_dtype) for k, v in params0.items()}
    state = jupd.UpdateState(params, tx.init(params), jp.init_scale_state(precision), jp.init_skip_state())
    step = jax.jit(jupd.make_update_step(specs, tx, loss_fn))
    trace = new_trace() if trace is None else trace
    for t, window in enumerate(windows(batches)):
        dtype = np.dtype(policy.param_dtype)
        factor = np.asarray(math.inf if t in poison else 1.0, dtype)
        arrays = jax_window(window, counts_of(window), dtype, poison=factor)
        lr = step_lr(precision.schedule_position(t, int(state.skips.skipped)))
        trace["lr"].append(lr)
        state, info = step(state, arrays, None, {"learning_rate": jnp.asarray(lr, policy.param_dtype)})
        metrics = jupd.finish_update(specs, state, info, update=t)
        trace["params"].append({k: np.asarray(v, np.float64) for k, v in state.params.items()})
        trace["opt_state"].append(state.opt_state)
        for key in ("skipped", "norm"):
            trace[key].append(getattr(metrics, "grad_norm" if key == "norm" else key))
        trace["scale"].append(metrics.loss_scale)
    return trace


RUNNERS = {"torch": run_torch, "jax": run_jax}
F64 = dict(dtype="float64", loss_scale="dynamic", init_scale=1024.0, growth_interval=2)


def assert_trace_close(got: dict, want: dict, atol: float, rtol: float) -> None:
    assert got["skipped"] == want["skipped"]
    assert got["scale"] == want["scale"]
    np.testing.assert_allclose(got["lr"], want["lr"], rtol=1e-15)
    for t, (g, w) in enumerate(zip(got["params"], want["params"])):
        for k in w:
            np.testing.assert_allclose(g[k], w[k], atol=atol, rtol=rtol, err_msg=f"update {t} {k}")
    kept = [(g, w) for g, w, s in zip(got["norm"], want["norm"], want["skipped"]) if not s]
    np.testing.assert_allclose([g for g, _ in kept], [w for _, w in kept], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# float64: exactly seed 000's loop
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", ["micro_batches", "tokens"])
@pytest.mark.parametrize("on_skip", ["advance", "hold"])
@pytest.mark.parametrize("name", ["torch", "jax"])
def test_float64_path_equals_seed_loop(name: str, on_skip: str, normalize: str) -> None:
    precision = PrecisionSpec(schedule_on_skip=on_skip, **F64)
    params, batches = make_data()
    want = seed_loop(params, batches, precision, normalize)
    assert want["skipped"] == [t in POISON for t in range(6)]
    with jax.enable_x64(True):
        got = RUNNERS[name](params, batches, precision, normalize)
    assert_trace_close(got, want, atol=1e-12, rtol=1e-10)
    positions = [precision.schedule_position(t, sum(want["skipped"][:t])) for t in range(6)]
    assert got["lr"] == [step_lr(p) for p in positions]  # hold: [.1 .1 .1 .05 .05 .05]


@pytest.mark.parametrize("on_skip", ["advance", "hold"])
def test_fused_kernel_holding_the_step_on_the_device_equals_seed_loop(on_skip: str) -> None:
    # the CUDA path (fused AdamW: after the first update the step is queued before the host reads
    # anything, held by found_inf on the device) against GradScaler.step handing the same kernel its found_inf
    precision = PrecisionSpec(schedule_on_skip=on_skip, **F64)
    params, batches = make_data()
    want = seed_loop(params, batches, precision, "tokens", fused=True)
    assert want["skipped"] == [t in POISON for t in range(6)]
    got = run_torch(params, batches, precision, "tokens", fused=True)
    # the float64 bound of the test above; measured 1.1e-16 absolute, 1.3e-14 relative (values up to 1.2)
    assert_trace_close(got, want, atol=1e-12, rtol=1e-10)
    for t in sorted(POISON):  # held: parameters and state as they were
        for k in got["params"][t]:
            np.testing.assert_array_equal(got["params"][t][k], got["params"][t - 1][k])
        for a, b in zip(got["opt_state"][t].values(), got["opt_state"][t - 1].values()):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_skipped_update_leaves_parameters_and_optimizer_state_untouched(name: str) -> None:
    params, batches = make_data()
    with jax.enable_x64(True):
        got = RUNNERS[name](params, batches, PrecisionSpec(**F64), "tokens")
        for t in sorted(POISON):
            for k in got["params"][t]:
                np.testing.assert_array_equal(got["params"][t][k], got["params"][t - 1][k])
            for a, b in zip(jax.tree.leaves(got["opt_state"][t]), jax.tree.leaves(got["opt_state"][t - 1])):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------------------------------------
# low precision on the CPU: autocast (torch) and the dtype policy (JAX)
# ---------------------------------------------------------------------------------------------


def test_float16_runs_skip_the_same_updates() -> None:
    # init_scale 2^20 overflows float16 gradients for three updates, growth overflows again at
    # update 14: those skips must agree as well as the injected one (update 4)
    precision = PrecisionSpec(dtype="float16", init_scale=2.0**20, growth_interval=3)
    params, batches = make_data(n_micro=45)
    t16 = run_torch(params, batches, precision, "tokens", poison={4})
    j16 = run_jax(params, batches, precision, "tokens", poison={4})
    assert t16["skipped"] == j16["skipped"] and t16["scale"] == j16["scale"]
    assert [t for t, s in enumerate(t16["skipped"]) if s] == [0, 1, 2, 4, 14]
    for k in params:  # measured 5e-7 (docs/divergences.md#precision)
        np.testing.assert_allclose(t16["params"][-1][k], j16["params"][-1][k], atol=1e-5, rtol=0)
    same_skips = {t for t, s in enumerate(t16["skipped"]) if s}
    f32 = run_torch(params, batches, PrecisionSpec(), "tokens", poison=same_skips)
    for k in params:  # float16 compute vs float32 with the same applied updates: measured 5.6e-4
        np.testing.assert_allclose(t16["params"][-1][k], f32["params"][-1][k], atol=2e-3, rtol=0)


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_bfloat16_path_needs_no_loss_scale(name: str) -> None:
    params, batches = make_data(n_micro=9)
    got = RUNNERS[name](params, batches, PrecisionSpec(dtype="bfloat16"), "tokens", poison=set())
    f32 = RUNNERS[name](params, batches, PrecisionSpec(), "tokens", poison=set())
    assert got["scale"] == [None] * 3 and not any(got["skipped"])
    for k in params:  # bfloat16 compute vs float32 after 3 AdamW updates: measured 7e-4
        np.testing.assert_allclose(got["params"][-1][k], f32["params"][-1][k], atol=5e-3, rtol=0)


def test_bfloat16_torch_and_jax_agree() -> None:
    params, batches = make_data(n_micro=9)
    t = run_torch(params, batches, PrecisionSpec(dtype="bfloat16"), "tokens", poison=set())
    j = run_jax(params, batches, PrecisionSpec(dtype="bfloat16"), "tokens", poison=set())
    for k in params:  # measured 2.4e-7: both round the same bfloat16 logits
        np.testing.assert_allclose(t["params"][-1][k], j["params"][-1][k], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# the non-finite policy inside the path
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_raise_names_the_loss_and_applies_nothing(name: str) -> None:
    params, batches = make_data(n_micro=6)
    precision = PrecisionSpec(dtype="float64", on_nonfinite="raise")
    with jax.enable_x64(True), pytest.raises(NonFiniteError, match=r"^the loss is non-finite at update 1 "):
        RUNNERS[name](params, batches, precision, "micro_batches", poison={1})


def _bad_bias_grad_loss(framework: str):
    # forward finite, backward NaN for b only: where()'s untaken branch gets 0 · inf
    if framework == "torch":
        def loss_fn(p, mb):
            out = tl.compute_loss(CE, ta.linear_forward(p, mb["x"]), mb["y"])
            trap = torch.where(torch.tensor(False), p["b"] * math.inf, torch.zeros(())).sum()
            return tl.LossOutput(out.value + trap, out.sum + trap, out.count)
        return loss_fn

    def jloss_fn(p, mb):
        out = jl.compute_loss(CE, ja.linear_forward(p, mb["x"]), mb["y"])
        trap = jnp.where(False, p["b"] * jnp.inf, 0.0).sum()
        return jl.LossOutput(out.value + trap, out.sum + trap, out.count)
    return jloss_fn


def test_raise_names_the_parameter_whose_gradient_went_bad() -> None:
    params0, batches = make_data(n_micro=3)
    precision = PrecisionSpec(dtype="float64", on_nonfinite="raise")
    specs_t, specs_j = _specs(precision, "micro_batches", tupd), _specs(precision, "micro_batches", jupd)
    params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params0.items()}
    opt = torch.optim.AdamW(list(params.values()))
    batch = [{"x": torch.tensor(mb["x"]), "y": torch.tensor(mb["y"])} for mb in batches]
    with pytest.raises(NonFiniteError, match=r"^the gradient of 'b' is non-finite at update 0"):
        tupd.apply_update(specs_t, params, opt, None, tp.LossScaler(precision), tp.init_skip_state(),
                          _bad_bias_grad_loss("torch"), batch, update=0)
    assert not opt.state and np.array_equal(params["b"].detach().numpy(), params0["b"])
    with jax.enable_x64(True):
        tx = optax.adamw(1e-3)
        jparams = {k: jnp.asarray(v) for k, v in params0.items()}
        state = jupd.UpdateState(jparams, tx.init(jparams), jp.init_scale_state(precision), jp.init_skip_state())
        new, info = jax.jit(jupd.make_update_step(specs_j, tx, _bad_bias_grad_loss("jax")))(state, jax_window(batches))
        with pytest.raises(NonFiniteError, match=r"^the gradient of 'b' is non-finite at update 0"):
            jupd.finish_update(specs_j, new, info, update=0)
        np.testing.assert_array_equal(np.asarray(new.params["b"]), params0["b"])


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_consecutive_skips_stop_training_with_the_last_good_parameters(name: str) -> None:
    params, batches = make_data(n_micro=18)
    precision = PrecisionSpec(max_consecutive_skips=2, **F64)
    trace = new_trace()
    with jax.enable_x64(True):
        with pytest.raises(NonFiniteError, match="3 consecutive updates were skipped .*last: the loss at update 4"):
            RUNNERS[name](params, batches, precision, "tokens", poison={2, 3, 4}, trace=trace)
        good = RUNNERS[name](params, batches[:6], precision, "tokens", poison=set())
    assert trace["skipped"] == [False, False, True, True]  # the raising update records nothing
    for k in params:  # the parameters are still those of the last applied update (1)
        np.testing.assert_array_equal(trace["params"][-1][k], good["params"][-1][k])


def test_nonfinite_loss_with_finite_gradients_is_skipped() -> None:
    # pinned: GradScaler looks at gradients only and steps when just the loss is inf
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale((p * p).sum() + math.inf).backward()
    scaler.step(opt)
    scaler.update()
    assert float(p.detach()) != 1.0 and scaler.get_scale() == 4.0
    # twinstep: the same update is skipped and the scale backs off, on both sides
    params0, batches = make_data(n_micro=3)
    precision = PrecisionSpec(dtype="float64", loss_scale="dynamic", init_scale=4.0)

    def tloss(p, mb):
        out = tl.compute_loss(CE, ta.linear_forward(p, mb["x"]), mb["y"])
        return tl.LossOutput(out.value + math.inf, out.sum + math.inf, out.count)

    def jloss(p, mb):
        out = jl.compute_loss(CE, ja.linear_forward(p, mb["x"]), mb["y"])
        return jl.LossOutput(out.value + jnp.inf, out.sum + jnp.inf, out.count)

    params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params0.items()}
    scaler_t = tp.LossScaler(precision)
    _, info = tupd.apply_update(_specs(precision, "micro_batches", tupd), params, torch.optim.AdamW(params.values()),
                                None, scaler_t, tp.init_skip_state(), tloss,
                                [{"x": torch.tensor(mb["x"]), "y": torch.tensor(mb["y"])} for mb in batches])
    assert info.skipped and math.isfinite(info.grad_norm) and scaler_t.get_scale() == 2.0
    assert np.array_equal(params["w"].detach().numpy(), params0["w"])
    with jax.enable_x64(True):
        specs = _specs(precision, "micro_batches", jupd)
        tx = optax.adamw(1e-3)
        jparams = {k: jnp.asarray(v) for k, v in params0.items()}
        state = jupd.UpdateState(jparams, tx.init(jparams), jp.init_scale_state(precision), jp.init_skip_state())
        new, info = jupd.make_update_step(specs, tx, jloss)(state, jax_window(batches))
        metrics = jupd.finish_update(specs, new, info)
    assert metrics.skipped and math.isfinite(metrics.grad_norm) and float(new.scale.scale) == 2.0
    np.testing.assert_array_equal(np.asarray(new.params["w"]), params0["w"])
