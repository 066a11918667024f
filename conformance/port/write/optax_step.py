"""The state and step function of an optax snippet: one optimizer update per call, as the spec says."""

from __future__ import annotations

from conformance.config import Config
from conformance.port.write.common import block, lit
from conformance.rules.groups import group_base_lrs
from conformance.rules.plateau import floors


def _scale_update(config: Config) -> str:
    p = config.precision
    if not p.dynamic_scaling:
        return "scale, tracker = state.scale, state.growth_tracker"
    return block(f'''
        # GradScaler's state machine: back off after a non-finite update, grow after
        # growth_interval finite ones (if the grown scale is finite), float32 throughout
        wide = state.scale.astype(WIDE)
        grown = (wide * {lit(p.growth_factor)}).astype(jnp.float32)
        at_interval = state.growth_tracker + 1 == {p.growth_interval}
        kept = jnp.where(jnp.isfinite(grown), grown, state.scale)
        scale = jnp.where(finite, jnp.where(at_interval, kept, state.scale),
                          (wide * {lit(p.backoff_factor)}).astype(jnp.float32))
        tracker = jnp.where(finite & ~at_interval, state.growth_tracker + 1, 0).astype(jnp.int32)
        ''')


def _policy(config: Config) -> str:
    p = config.precision
    lines = []
    if p.on_nonfinite == "raise":
        lines.append("if bool(metrics[\"skipped\"]):\n    raise FloatingPointError(\"non-finite loss or gradient "
                     "(on_nonfinite = 'raise'); the update was not applied\")")
    elif p.max_consecutive_skips is not None:
        lines.append(f"if int(state.skipped_in_a_row) > {p.max_consecutive_skips}:\n    raise FloatingPointError("
                     f"f\"{{int(state.skipped_in_a_row)}} consecutive updates skipped for non-finite values "
                     f"(max_consecutive_skips = {p.max_consecutive_skips})\")")
    if config.clip.error_if_nonfinite:
        lines.append("if not bool(metrics[\"skipped\"]) and not math.isfinite(float(metrics[\"grad_norm\"])):\n"
                     "    raise FloatingPointError(\"the gradient norm is non-finite (clip.error_if_nonfinite)\")")
    return "\n".join(lines)


def _ema_fields(config: Config) -> str:
    if not config.ema.enabled:
        return ""
    pad = "\n" + " " * 12  # the class body's indentation in the template below
    return (f"{pad}ema: dict               # [ema]: the weights' EMA (float32, float64 for float64 weights)"
            f"{pad}ema_started: jax.Array  # the first due update copies the weights"
            f"{pad}update: jax.Array       # updates done, skipped ones too")


def _ema_init(config: Config) -> str:
    if not config.ema.enabled:
        return ""
    return (", {k: jnp.zeros(v.shape, jnp.float64 if v.dtype == jnp.float64 else jnp.float32) "
            "for k, v in params.items()},\n                      jnp.asarray(False), zero")


def _ema_state(config: Config) -> str:
    if not config.ema.enabled:
        return ""
    return ",\n                               *ema_update(state, keep(new_params, state.params), finite)"


def ema_code(config: Config) -> str:
    """ema_update(state, params, finite) -> (ema, started, update) of the optax snippet ([ema])."""
    if not config.ema.enabled:
        return ""
    e = config.ema
    w = 1.0 - float(e.decay)  # type: ignore[arg-type]
    mix = (f"e + {lit(w)} * (q - e)" if w < 0.5 else f"q + {lit(w - 1)} * (q - e)")  # torch's lerp(e, q, w)
    return block(f'''
        def ema_update(state, params, finite):
            """[ema] after an update: due when applied, update >= {e.start} and (update - {e.start}) % {e.every} == 0;
            the first due update copies the weights, later ones lerp(ema, p, 1 - decay) (torch's lerp)."""
            due = finite & (state.update >= {e.start}) & ((state.update - {e.start}) % {e.every} == 0)

            def move(e, p):
                q = p.astype(e.dtype)
                return jnp.where(due, jnp.where(state.ema_started, {mix}, q), e)

            return jax.tree.map(move, state.ema, params), state.ema_started | due, state.update + 1
        ''')


def _lines(text: str, indent: int) -> list[str]:
    return block(text, indent).split("\n") if text else []


def step_code(config: Config) -> str:
    """TrainState, init(params) and make_train_step(apply_fn, loss_fn[, count_fn])."""
    p, a = config.precision, config.accumulation
    tokens = a.normalize == "tokens"
    sig = "apply_fn, loss_fn, count_fn" if tokens else "apply_fn, loss_fn"
    what = ("loss_fn(output, y) -> the loss summed over y's valid elements; count_fn(y) -> their number"
            if tokens else "loss_fn(output, y) -> the micro-batch's mean loss")
    divisor = "total" if tokens else "len(window)"
    advance = "finite" if p.schedule_on_skip == "hold" else "True"
    head = block(f'''
        WIDE = jnp.result_type(float)  # float64 under x64
        INIT_SCALE = {lit(p.init_scale if p.dynamic_scaling else 1.0)}
        NORM_TYPE = {lit(config.clip.norm_type)}


        class TrainState(NamedTuple):
            params: dict            # {{name: array}} in PARAM_DTYPE
            opt_state: object
            scale: jax.Array        # the loss scale (float32; 1 without dynamic scaling)
            growth_tracker: jax.Array
            position: jax.Array     # the schedule's update count (held on skipped updates)
            skipped_in_a_row: jax.Array{_ema_fields(config)}


        def init(params):
            params = {{k: jnp.asarray(v, PARAM_DTYPE) for k, v in params.items()}}
            zero = jnp.zeros([], jnp.int32)
            return TrainState(params, TX.init(params), jnp.asarray(INIT_SCALE, jnp.float32), zero, zero, zero{_ema_init(config)})


        def grad_norm(grads):
            """torch's get_total_norm (logged before clipping)."""
            leaves = [jnp.ravel(jnp.abs(g)) for g in jax.tree.leaves(grads) if g.size]
            if not leaves:
                return jnp.zeros((), PARAM_DTYPE)
            if math.isinf(NORM_TYPE):
                return jnp.max(jnp.stack([x.max() for x in leaves]))
            per = jnp.stack([jnp.sum(x ** NORM_TYPE) ** (1.0 / NORM_TYPE) for x in leaves])
            return jnp.sum(per ** NORM_TYPE) ** (1.0 / NORM_TYPE)


        def make_train_step({sig}):
            """step(state, window) -> (state, metrics): one update over `window`, a list of (x, y)
            micro-batches ({a.steps} per update). apply_fn(params, x) -> output; {what}."""

            def window_grads(params, window, scale):
        ''').split("\n")
    grads = _lines("total = sum(jnp.asarray(count_fn(y), PARAM_DTYPE) for _, y in window)  # known before the "
                   "forward pass", 8) if tokens else []
    grads += _lines(f'''
        def part(q, x, y):
            cast = jax.tree.map(lambda v: v.astype(COMPUTE_DTYPE), q)
            value = loss_fn(apply_fn(cast, x).astype(PARAM_DTYPE), y) / {divisor}
            return value * scale.astype(value.dtype), value
        grads, loss = None, 0.0
        for x, y in window:  # gradients add up as torch's .grad does
            g, value = jax.grad(part, has_aux=True)(params, x, y)
            grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
            loss = loss + value
        return grads, loss
        ''', 8)
    step = _lines('''
        @jax.jit
        def step(state, window):
            grads, loss = window_grads(state.params, window, state.scale)
        ''', 4)
    if p.dynamic_scaling:
        step += _lines('''
            inv = (jnp.asarray(1.0, WIDE) / state.scale.astype(WIDE)).astype(jnp.float32)  # GradScaler's 1 / scale
            grads = jax.tree.map(lambda g: (g.astype(jnp.promote_types(g.dtype, jnp.float32)) * inv).astype(g.dtype), grads)
            ''', 8)
    step += _lines('''
        finite = jnp.isfinite(loss) & jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        s = (state.position // UPDATES_PER_EPOCH).astype(WIDE)  # the schedule step
        ''', 8)
    if config.schedule.name == "reduce_on_plateau":  # the lrs observe() left in the state
        step += _lines('hyper = {f"lr_{i}": state.opt_state.hyperparams[f"lr_{i}"] for i in range(len(LR_SCHEDULES))}', 8)
    else:
        step += _lines('hyper = {f"lr_{i}": jnp.asarray(fn(s), PARAM_DTYPE) for i, fn in enumerate(LR_SCHEDULES)}', 8)
    if _momentum_marker(config):
        step += _lines('hyper.update({f"momentum_{i}": jnp.asarray(MOMENTUM_SCHEDULE(s), PARAM_DTYPE) '
                       'for i in range(len(LR_SCHEDULES))})', 8)
    if config.schedule.hyper:
        step += _lines('hyper.update({n: jnp.asarray(fn(s), PARAM_DTYPE) for n, fn in HYPER_SCHEDULES.items()})', 8)
    step += _lines('''
        opt_state = state.opt_state._replace(hyperparams={**state.opt_state.hyperparams, **hyper})
        updates, new_opt = TX.update(grads, opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        ''', 8)
    step += _lines(_scale_update(config), 8)
    step += _lines(f'''
        position = state.position + jnp.asarray({advance}, jnp.int32)  # schedule_on_skip = "{p.schedule_on_skip}"
        skips = jnp.where(finite, 0, state.skipped_in_a_row + 1).astype(jnp.int32)
        new_state = TrainState(keep(new_params, state.params), keep(new_opt, opt_state), scale, tracker,
                               position, skips{_ema_state(config)})
        metrics = {{"loss": loss, "grad_norm": grad_norm(grads), "skipped": ~finite,
                   "lr": [hyper[f"lr_{{i}}"] for i in range(len(LR_SCHEDULES))]}}
        return new_state, metrics
        ''', 8)
    host = _lines('''
        def train_step(state, window):
            state, metrics = step(state, window)
        ''', 4) + _lines(_policy(config), 8) + ["        return state, metrics", "", "    return train_step"]
    out = "\n".join(head + grads + [""] + step + [""] + host)
    if config.schedule.name == "reduce_on_plateau":
        out = _plateau_code(config, out)
    ema = ema_code(config)
    return out + ("\n\n\n" + ema if ema else "")


def _plateau_code(config: Config, code: str) -> str:
    """reduce_on_plateau: init() puts each group's lr in the injected hyper-parameters, the step
    keeps them, and observe(state, plateau, metric) is torch's ReduceLROnPlateau.step on the host
    (plateau_init() to start)."""
    s = config.schedule
    code = code.replace(
        "    return TrainState(params, TX.init(params), ",
        "    opt_state = TX.init(params)\n"
        "    lrs = {f\"lr_{i}\": jnp.asarray(fn(0.0), PARAM_DTYPE) for i, fn in enumerate(LR_SCHEDULES)}\n"
        "    opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, **lrs})\n"
        "    return TrainState(params, opt_state, ")
    better = {("min", "rel"): f"metric < best * (1 - {lit(s.threshold)})", ("min", "abs"): f"metric < best - {lit(s.threshold)}",
              ("max", "rel"): f"metric > best * (1 + {lit(s.threshold)})", ("max", "abs"): f"metric > best + {lit(s.threshold)}"}
    worst = "math.inf" if s.mode == "min" else "-math.inf"
    per_group = floors(s, len(group_base_lrs(config.optimizer)))
    return code + "\n\n\n" + block(f'''
        class Plateau(NamedTuple):
            """reduce_on_plateau's state: torch's ReduceLROnPlateau attributes, each group's lr (float64)."""
            best: float
            num_bad_epochs: int
            cooldown_counter: int
            lrs: tuple


        def plateau_init():
            return Plateau({worst}, 0, 0, tuple(float(fn(0.0)) for fn in LR_SCHEDULES))


        def observe(state, plateau, metric):
            """The {s.monitor} of an evaluation after an update -> (state, plateau): torch's
            ReduceLROnPlateau.step (mode {s.mode!r}, threshold_mode {s.threshold_mode!r})."""
            best, bad, cooldown, lrs = plateau
            metric = float(metric)
            best, bad = (metric, 0) if {better[(s.mode, s.threshold_mode)]} else (best, bad + 1)
            if cooldown > 0:
                cooldown, bad = cooldown - 1, 0
            if bad <= {s.patience}:
                return state, Plateau(best, bad, cooldown, lrs)
            lower = [max(old * {lit(s.factor)}, floor) for old, floor in zip(lrs, {lit(per_group)})]
            lrs = tuple(new if old - new > {lit(s.eps)} else old for old, new in zip(lrs, lower))
            hyper = {{**state.opt_state.hyperparams, **{{f"lr_{{i}}": jnp.asarray(x, PARAM_DTYPE) for i, x in enumerate(lrs)}}}}
            state = state._replace(opt_state=state.opt_state._replace(hyperparams=hyper))
            return state, Plateau(best, 0, {s.cooldown}, lrs)
        ''')


def _momentum_marker(config: Config) -> str:
    from conformance.rules.schedules import cycled_hyperparameter

    return "MOMENTUM_SCHEDULE" if cycled_hyperparameter(config.schedule, config.optimizer) else ""
