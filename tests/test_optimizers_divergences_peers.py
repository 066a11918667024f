"""The divergences of docs/divergences.md#optimizers that involve Keras 3, the schedulefree package and
optax.contrib.schedule_free, pinned: each test measures the frameworks' own built-ins in float64 and
fails if either changes (Keras on its JAX backend; it is an optional extra, skipped without it)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

FIRST, REST = np.full(10, 0.01), np.arange(0.1, 1.1, 0.1)[:10]  # Keras's golden tests' gradients
GOLDEN = [FIRST] + [REST] * 4
RNG = np.random.default_rng(3)
NORMAL = [RNG.standard_normal(10) for _ in range(20)]
LOW_ADAMAX, HIGH_ADAMAX = 1.5e-4, 2.2e-4  # measured 1.9e-4 (eps 0.3, lr 0.1, 20 updates)


@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("KERAS_BACKEND", "jax")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip("the Keras pins run on Keras's JAX backend")
    previous = keras.config.floatx()
    keras.config.set_floatx("float64")  # the lr and weight decay variables in float64 too
    yield keras
    keras.config.set_floatx(previous)


def keras_run(make, grads, p0=None) -> list[np.ndarray]:
    """`make()` builds the Keras optimizer inside the x64 scope (its lr variable is float64 then)."""
    with jax.enable_x64(True):
        import keras

        opt = make()
        x = keras.Variable(np.ones(10) if p0 is None else p0, dtype="float64")
        out = []
        for g in grads:
            opt.apply_gradients([(jnp.asarray(g), x)])
            out.append(np.asarray(x, np.float64).copy())
    return out


def torch_run(make, grads, p0=None, before=None) -> list[np.ndarray]:
    p = torch.nn.Parameter(torch.tensor(np.ones(10) if p0 is None else p0, dtype=torch.float64))
    opt = make([p])
    out = []
    for t, g in enumerate(grads, 1):
        p.grad = torch.tensor(g, dtype=torch.float64)
        if before is not None:
            before(opt, p, t)
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


def gap(a: list, b: list) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def _eps_hat(eps: float, b2: float = 0.999):
    def before(opt, p, t):  # ε/√(1−β2ᵗ) on √v̂ is ε on the raw √v
        opt.param_groups[0]["eps"] = eps / (1 - b2 ** t) ** 0.5
    return before


@pytest.mark.parametrize(("eps", "grads", "lr", "first", "low", "high"), [
    (1e-8, NORMAL, 1e-3, True, 1.2e-9, 1.7e-9),   # typical set-up: ~30·lr·ε/|g| at update 1
    (1e-4, NORMAL, 1e-3, True, 1.2e-5, 1.6e-5),
    (1e-2, NORMAL, 1e-3, True, 5e-4, 8e-4),
    (2.0, GOLDEN, 1.0, True, 4.7e-3, 4.9e-3),     # Keras's AdamW golden: 4.8e-3 at update 1
    (2.0, GOLDEN, 1.0, False, 0.9, 1.0),          # ... 0.93 over its 5 updates
])
def test_adam_eps_hat_differs_from_torch_and_grows_with_eps(keras, eps, grads, lr, first, low, high) -> None:
    """O-ADAM-EPS: Keras's Adam adds ε to the raw √v (ε̂ = ε·... in torch's terms ε/√(1−β2ᵗ): 31.6·ε
    at t = 1 for β2 = 0.999); torch adds ε to √v̂. Torch with ε/√(1−β2ᵗ) set per update is Keras."""
    k = keras_run(lambda: keras.optimizers.Adam(learning_rate=lr, epsilon=eps), grads)
    t = torch_run(lambda p: torch.optim.Adam(p, lr=lr, eps=eps), grads)
    measured = gap(k[:1], t[:1]) if first else gap(k, t)
    assert low <= measured <= high, f"eps {eps}: {measured:.3e}"
    assert gap(k, torch_run(lambda p: torch.optim.Adam(p, lr=lr, eps=eps), grads, before=_eps_hat(eps))) < 1e-12


@pytest.mark.parametrize("name", ["RMSprop", "Adagrad", "Adamax", "SGD", "Nadam", "Lion"])
def test_keras_decays_every_optimizer_before_its_step(keras, name: str) -> None:
    """O-WD-KERAS: with a zero gradient one Keras update is exactly p·(1 − lr·wd) on every optimizer
    (keras's own test_weight_decay); torch's weight_decay on RMSprop, Adagrad, Adamax is L2."""
    p0 = np.linspace(-2.0, 2.0, 10)
    out = keras_run(lambda: getattr(keras.optimizers, name)(learning_rate=0.1, weight_decay=0.05), [np.zeros(10)], p0)
    np.testing.assert_allclose(out[0], p0 - p0 * 0.05 * 0.1, rtol=1e-15, atol=0)


@pytest.mark.parametrize(("name", "low", "high"), [("RMSprop", 0.45, 0.52), ("Adagrad", 0.29, 0.35),
                                                  ("Adamax", 0.46, 0.54)])
def test_torch_l2_decay_is_not_kerass(keras, name: str, low: float, high: float) -> None:
    """The same hyper-parameters, torch's coupled L2 against Keras's decoupled decay: 0.32–0.50 off
    after one update (lr 1, wd 0.5, Keras's golden first gradient 0.01 on p = 1) — twinstep:
    decoupled_weight_decay = true."""
    make = {"RMSprop": lambda p: torch.optim.RMSprop(p, lr=1.0, alpha=0.9, eps=1e-7, weight_decay=0.5),
            "Adagrad": lambda p: torch.optim.Adagrad(p, lr=1.0, eps=1e-7, initial_accumulator_value=0.1,
                                                     weight_decay=0.5),
            "Adamax": lambda p: torch.optim.Adamax(p, lr=1.0, eps=1e-7, weight_decay=0.5)}[name]
    k = keras_run(lambda: getattr(keras.optimizers, name)(learning_rate=1.0, weight_decay=0.5), [FIRST])
    assert low <= gap(k, torch_run(make, [FIRST])) <= high


def test_keras_adamax_adds_eps_outside_the_max(keras) -> None:
    """O-ADAMAX-EPS: Keras's u = max(β2·u, |g|), p − lr/(1−β1ᵗ)·m/(u + ε); torch's u = max(β2·u, |g| + ε)
    (equal for small ε: 'none' in O-ADAMAX)."""
    k = keras_run(lambda: keras.optimizers.Adamax(learning_rate=0.1, epsilon=0.3), NORMAL)
    t = torch_run(lambda p: torch.optim.Adamax(p, lr=0.1, eps=0.3), NORMAL)
    assert LOW_ADAMAX < gap(k, t) < HIGH_ADAMAX
    small = keras_run(lambda: keras.optimizers.Adamax(learning_rate=0.1, epsilon=1e-12), GOLDEN)
    assert gap(small, torch_run(lambda p: torch.optim.Adamax(p, lr=0.1, eps=1e-12), GOLDEN)) < 1e-10


def test_keras_nadam_is_torch_nadam_with_momentum_decay_one(keras) -> None:
    """O-NADAM-KERAS: Keras's Nadam schedule is μ_t = β1·(1 − ½·0.96^t): torch's NAdam with
    momentum_decay = 1 (torch's default 4e-3 is 0.96^(0.004·t)); ε on √v̂ as torch."""
    k = keras_run(lambda: keras.optimizers.Nadam(learning_rate=0.05, epsilon=1e-7), NORMAL)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # torch's mu_product follows the default dtype (O-NADAM-F32)
    try:
        same = torch_run(lambda p: torch.optim.NAdam(p, lr=0.05, eps=1e-7, momentum_decay=1.0), NORMAL)
        default = torch_run(lambda p: torch.optim.NAdam(p, lr=0.05, eps=1e-7), NORMAL)
    finally:
        torch.set_default_dtype(previous)
    assert gap(k, same) < 1e-13 and gap(k, default) > 1e-3


def test_keras_rmsprop_and_adagrad_put_eps_inside_the_root(keras) -> None:
    """Keras's RMSprop (ρ = 0.9, ε = 1e-7) and Adagrad (accumulator from 0.1) are optax's placements:
    eps_in_sqrt = true (optax.rmsprop, optax.adagrad; Keras has no zero guard, equal for S > 0)."""
    def optax_run(make, grads):
        with jax.enable_x64(True):
            tx, p = make(), jnp.ones(10)
            s, out = tx.init(p), []
            for g in grads:
                u, s = tx.update(jnp.asarray(g), s, p)
                p = optax.apply_updates(p, u)
                out.append(np.asarray(p))
        return out

    k = keras_run(lambda: keras.optimizers.RMSprop(learning_rate=0.01), NORMAL)
    assert gap(k, optax_run(lambda: optax.rmsprop(0.01, decay=0.9, eps=1e-7, eps_in_sqrt=True), NORMAL)) < 1e-13
    k = keras_run(lambda: keras.optimizers.Adagrad(learning_rate=0.1), NORMAL)
    assert gap(k, optax_run(lambda: optax.adagrad(0.1, initial_accumulator_value=0.1, eps=1e-7), NORMAL)) < 1e-13


def test_keras_ema_copies_the_first_update_then_averages(keras) -> None:
    """E-EMA: Keras's use_ema keeps ema = p after the first update, then μ·ema + (1−μ)·p — torch's
    AveragedModel(get_ema_multi_avg_fn(μ)) updated after each step; optax.ema(μ) debiases instead."""
    with jax.enable_x64(True):
        opt = keras.optimizers.SGD(learning_rate=0.1, use_ema=True, ema_momentum=0.9)
        x = keras.Variable(np.ones(10), dtype="float64")
        seen = []
        for g in NORMAL[:3]:
            opt.apply_gradients([(jnp.asarray(g), x)])
            seen.append(np.asarray(x).copy())
        ema = np.asarray(opt._model_variables_moving_average[0])
    want = seen[0]
    for p in seen[1:]:
        want = 0.9 * want + 0.1 * p
    np.testing.assert_allclose(ema, want, rtol=1e-14)
    model = torch.nn.Linear(10, 1, bias=False).double()
    averaged = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    with torch.no_grad():
        for p in seen:
            model.weight.copy_(torch.tensor(p).reshape(1, 10))
            averaged.update_parameters(model)
    np.testing.assert_allclose(averaged.module.weight.detach().numpy().reshape(10), want, rtol=1e-14)
    with jax.enable_x64(True):
        tx, s = optax.ema(0.9, debias=True), None
        s = tx.init(jnp.asarray(seen[0]))
        for p in seen:
            debiased, s = tx.update(jnp.asarray(p), s)
    assert 1e-3 < float(np.max(np.abs(np.asarray(debiased) - want)))  # optax's debiased EMA is another rule


def _schedulefree(name: str, grads: list, missing: int | None = None, **kw):
    """The package's optimizer on p (10,) and q (3,) in float64; q has no gradient at update `missing`."""
    sf = pytest.importorskip("schedulefree")
    p = torch.nn.Parameter(torch.ones(10, dtype=torch.float64))
    q = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = getattr(sf, name)([p, q], foreach=False, **kw)
    opt.train()
    for k, g in enumerate(grads):
        p.grad = torch.tensor(g, dtype=torch.float64)
        q.grad = None if k == missing else torch.tensor(g[:3], dtype=torch.float64)
        opt.step()
    return opt, p, q


def test_schedulefree_counts_updates_per_group() -> None:
    """SF-COUNT: the package keeps k, weight_sum and lr_max per parameter group, so a parameter without
    a gradient in an update still advances them (its next averaging weight and bias correction see
    the group's count); twinstep counts per parameter, as torch.optim does for every optimizer."""
    opt, p, q = _schedulefree("AdamWScheduleFree", NORMAL[:4], missing=1, lr=0.05)
    assert opt.param_groups[0]["k"] == 4  # q received 3 updates
    full, _, q_full = _schedulefree("AdamWScheduleFree", [g for i, g in enumerate(NORMAL[:4]) if i != 1], lr=0.05)
    assert full.param_groups[0]["k"] == 3
    assert float(torch.max(torch.abs(q - q_full))) > 1e-4  # the same 3 gradients, another trajectory


def test_schedulefree_eval_train_round_trip_is_not_bit_exact() -> None:
    """SF-EVAL: the package reaches x from y and z by interpolation (eval: lerp with weight 1 − 1/β1;
    train: back with 1 − β1), which rounds: y after eval()+train() is not the y the update produced
    (twinstep does the same; its trainers switch at the same points of every run, so that a resumed
    run, which starts from the x of its checkpoint, continues bit for bit)."""
    sf = pytest.importorskip("schedulefree")
    rng = np.random.default_rng(0)
    p = torch.nn.Parameter(torch.tensor(rng.standard_normal(100)))
    opt = sf.AdamWScheduleFree([p], lr=0.05, betas=(0.7, 0.999), foreach=False)
    opt.train()
    for _ in range(5):
        p.grad = torch.tensor(rng.standard_normal(100))
        opt.step()
    y = p.detach().clone()
    opt.eval()
    opt.train()
    assert 0 < float(torch.max(torch.abs(p.detach() - y))) <= 2.3e-16  # one ulp off here


def test_schedulefree_production_equals_its_reference() -> None:
    """The package's AdamWScheduleFree (y and z only, which twinstep follows) and its
    AdamWScheduleFreeReference (x kept) agree to rounding in float64."""
    sf = pytest.importorskip("schedulefree")
    out = []
    for cls in (sf.AdamWScheduleFree, sf.AdamWScheduleFreeReference):
        p = torch.nn.Parameter(torch.ones(10, dtype=torch.float64))
        opt = cls([p], lr=0.05, warmup_steps=3, weight_decay=0.1, r=0.5)
        opt.train()
        for g in NORMAL:
            p.grad = torch.tensor(g, dtype=torch.float64)
            opt.step()
        out.append(p.detach().numpy().copy())
    assert float(np.max(np.abs(out[0] - out[1]))) < 1e-14


def _optax_schedule_free(warmup: int, shifted: bool = False):
    def make():
        lr = 0.05
        if warmup:  # counts as float64 first: optax's int32 counts make float32 schedules (S-INT32)
            raw = optax.warmup_constant_schedule(0.0, lr, warmup)
            sched = lambda c: raw(jnp.asarray(c, jnp.float64))  # noqa: E731
        else:
            sched = lr
        inner = sched if not shifted else (lambda c: sched(jnp.asarray(c, jnp.float64) + 1))  # the recipe
        base = optax.chain(optax.scale_by_rms(decay=0.999, eps=1e-8, eps_in_sqrt=False, bias_correction=True),
                           optax.add_decayed_weights(0.1), optax.scale_by_learning_rate(inner))
        return optax.contrib.schedule_free(base, learning_rate=sched, b1=0.9)

    with jax.enable_x64(True):
        tx, p = make(), jnp.ones(10)
        s = tx.init(p)
        for g in NORMAL[:8]:
            u, s = tx.update(jnp.asarray(g), s, p)
            p = optax.apply_updates(p, u)
        return np.asarray(p)


def test_optax_schedule_free_evaluates_its_schedule_one_count_ahead() -> None:
    """SF-OPTAX (optax PR #1744, optax 0.2.8): optax.contrib.schedule_free's state counts from 1 and
    evaluates the schedule there for the averaging weights, while the wrapped optimizer's
    scale_by_learning_rate counts from 0: under a warm-up its z moves by the previous update's
    warm-up lr (0 at update 0). Equal to schedulefree without a warm-up; with the inner schedule
    shifted by one count it is schedulefree with warm-up (what twinstep's optax snippet writes)."""
    _, p, _ = _schedulefree("AdamWScheduleFree", NORMAL[:8], lr=0.05, warmup_steps=3, weight_decay=0.1)
    package = p.detach().numpy()
    assert float(np.max(np.abs(_optax_schedule_free(3) - package))) > 1e-3
    assert float(np.max(np.abs(_optax_schedule_free(3, shifted=True) - package))) < 1e-14
    _, p0, _ = _schedulefree("AdamWScheduleFree", NORMAL[:8], lr=0.05, weight_decay=0.1)
    assert float(np.max(np.abs(_optax_schedule_free(0) - p0.detach().numpy()))) < 1e-14


def test_optax_ademamix_reads_its_schedules_one_count_behind_the_reference() -> None:
    """AD-COUNT: optax.contrib.ademamix calls its alpha schedule with the count before the update
    (0 first). A linear ramp of that count gives α = 0 at update 0, which is then optax.adam's
    update exactly; apple/ml-ademamix's torch class ramps over t = count + 1, so its first update
    adds α/T·(1 − β3)·g over Adam's denominator (hand calculation), as twinstep's oracle does."""
    from conformance.config import load_config
    from conformance.oracle.optimizers import init_state, update

    g, lr, alpha, warmup, b3 = NORMAL[0], 0.1, 8.0, 4, 0.999
    with jax.enable_x64(True):
        p0 = jnp.zeros(10)

        def first(alpha_of_count) -> np.ndarray:
            tx = optax.contrib.ademamix(lr, 0.9, 0.999, b3, alpha_of_count)
            return np.asarray(tx.update(jnp.asarray(g), tx.init(p0), p0)[0])

        adam = np.asarray(optax.adam(lr).update(jnp.asarray(g), optax.adam(lr).init(p0), p0)[0])
        behind = first(lambda c: jnp.where(c < warmup, c / warmup * alpha, alpha))
        ahead = first(lambda c: jnp.where(c + 1 < warmup, (c + 1.0) / warmup * alpha, alpha))
    denom = np.abs(g) + 1e-8  # √v̂ + ε at update 0
    reference = -lr * (g / denom + alpha / warmup * (1 - b3) * g / denom)
    # α = 0: optax runs Adam's operations (measured equal bit for bit; 1e-15 is ~5 ulps). The
    # reference takes about ten float64 roundings of same-signed terms, so ≤ ~1e-15 apart (measured
    # 2.8e-16); 1e-13 is that bound with room, far below the 1e-4 offset the pin is about
    np.testing.assert_allclose(behind, adam, rtol=1e-15, atol=0)
    np.testing.assert_allclose(ahead, reference, rtol=1e-13, atol=0)
    assert float(np.max(np.abs(behind - reference))) > 1e-4  # the offset is visible at update 0
    hp = load_config({"optimizer": {"name": "ademamix", "lr": lr, "alpha": alpha, "alpha_warmup": warmup,
                                    "beta3": b3}}).optimizer.overrides()
    oracle, _ = update("ademamix", hp, np.zeros(10), g, init_state("ademamix", hp, np.zeros(10)))
    np.testing.assert_allclose(oracle, reference, rtol=1e-13, atol=0)
