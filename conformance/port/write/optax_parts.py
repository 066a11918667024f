"""Source text of the custom optax transforms a snippet writes out where optax's own math differs
from the spec (torch's semantics): SGD dampening, torch's AMSGrad, Keras's eps_hat, Adagrad with
eps outside the root, NAdam's momentum schedule, RAdam, Adafactor, Muon, clip_grad_norm_'s eps,
the schedule-free warm-up, AdEMAMix's warm-ups, cautious updates and cautious weight decay, and
prodigyopt's Prodigy."""

from __future__ import annotations

CAUTIOUS = '''
def cautious(inner):
    """Cautious updates (C-Optim) as pytorch-optimizer's apply_cautious: the inner transform's
    update zeroed where it disagrees in sign with the gradient, the rest scaled by n / (Σmask + 1),
    per tensor; the inner state unchanged."""
    def update(g, state, params=None):
        u, state = inner.update(g, state, params)
        def mask(u, x):
            m = (u * x > 0).astype(u.dtype)
            return u * (m * (m.size / (jnp.sum(m) + 1)))
        return jax.tree.map(mask, u, g), state
    return optax.GradientTransformation(inner.init, update)
'''

CAUTIOUS_DECAY = '''
def cautious_decayed_weights(weight_decay):
    """Cautious weight decay (Chen et al. 2025; heavyball's cautious_weight_decay): optax's
    add_decayed_weights only where the update u and the parameter agree in sign, u + wd·p·[u·p >= 0]
    (p then moves against u: the decay only where the step moves p toward zero)."""
    def update(u, state, params):
        return jax.tree.map(lambda u, p: u + weight_decay * (p * (u * p >= 0).astype(p.dtype)), u, params), state
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
'''

COUNT = '''
def _count_state(params, *names, fill=0.0):
    """A step count and zero-filled trees, one per name."""
    zeros = lambda: jax.tree.map(lambda p: jnp.full_like(p, fill), params)
    return {"count": jnp.zeros([], jnp.int32), **{n: zeros() for n in names}}
'''

MOMENTUM = '''
def torch_momentum(momentum, dampening, nesterov):
    """torch.optim.SGD's buffer: g at the first update, then mu*b + (1 - dampening)*g (optax.trace
    has no dampening, and scaling g dampens the first update too)."""
    def init(params):
        return _count_state(params, "buf")
    def update(g, s, params=None):
        first = s["count"] == 0
        buf = jax.tree.map(lambda b, x: jnp.where(first, x, momentum * b + (1 - dampening) * x), s["buf"], g)
        out = jax.tree.map(lambda x, b: x + momentum * b, g, buf) if nesterov else buf
        return out, {"count": s["count"] + 1, "buf": buf}
    return optax.GradientTransformation(init, update)
'''

AMSGRAD = '''
def torch_amsgrad(b1, b2, eps, eps_root=0.0):
    """torch's AMSGrad: the max of the raw v, bias-corrected by the current step (optax.amsgrad
    keeps the max of the bias-corrected v)."""
    def init(params):
        return _count_state(params, "m", "v", "v_max")
    def update(g, s, params=None):
        t = s["count"] + 1
        m = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * x, s["m"], g)
        v = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * x * x, s["v"], g)
        v_max = jax.tree.map(jnp.maximum, s["v_max"], v)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        if eps_root:
            den = lambda vm: jnp.sqrt(vm / bc2 + eps_root) + eps
        else:
            den = lambda vm: jnp.sqrt(vm) / jnp.sqrt(bc2) + eps
        out = jax.tree.map(lambda m, vm: (m / bc1) / den(vm), m, v_max)
        return out, {"count": t, "m": m, "v": v, "v_max": v_max}
    return optax.GradientTransformation(init, update)
'''

EPS_HAT = '''
def adam_eps_hat(b1, b2, eps, amsgrad=False):
    """Keras's Adam (eps_hat): sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps), eps on the raw
    sqrt(v) (with amsgrad: the max of the raw v, as torch and Keras keep it)."""
    def init(params):
        return _count_state(params, "m", "v", "v_max")
    def update(g, s, params=None):
        t = s["count"] + 1
        m = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * x, s["m"], g)
        v = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * x * x, s["v"], g)
        v_max = jax.tree.map(jnp.maximum, s["v_max"], v) if amsgrad else s["v_max"]
        step = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        out = jax.tree.map(lambda m, v: step * m / (jnp.sqrt(v) + eps), m, v_max if amsgrad else v)
        return out, {"count": t, "m": m, "v": v, "v_max": v_max}
    return optax.GradientTransformation(init, update)
'''

WARMUP = '''
def free_lr(lr, warmup_steps, ahead=0):
    """schedulefree's warmed-up lr lr*min(1, k/warmup_steps) at count k = c + ahead (counts as float64:
    S-INT32). optax.contrib.schedule_free evaluates its schedule at counts from 1, the chain it wraps
    from 0: the wrapped chain's lr goes one count ahead (SF-OPTAX), as schedulefree's update does."""
    def schedule(c):
        k = jnp.asarray(c, WIDE) + ahead
        return lr * (jnp.minimum(1.0, k / warmup_steps) if warmup_steps else 1.0)
    return schedule
'''

ADEMAMIX = '''
def ademamix_alpha(alpha, warmup):
    """apple/ml-ademamix's alpha warm-up (linear from 0) as a function of optax.contrib.ademamix's
    count, which it reads before its increment: the reference's step t is count + 1."""
    return lambda count: jnp.where(count + 1 < warmup, (count + 1.0) / warmup * alpha, alpha)


def ademamix_beta3(beta1, beta3, warmup):
    """apple/ml-ademamix's beta3 warm-up (from beta1, linear in the EMA's half-life
    f(b) = ln(0.5)/ln(b + 1e-8) - 1) as a function of optax's count (t = count + 1)."""
    f = lambda b: jnp.log(0.5) / jnp.log(b + 1e-8) - 1
    def b3(count):
        a = (count + 1.0) / warmup
        return jnp.where(count + 1 < warmup, 0.5 ** (1 / ((1 - a) * f(beta1) + a * f(beta3) + 1)), beta3)
    return b3
'''

ADAGRAD = '''
def torch_adagrad(initial_accumulator_value, eps, lr_decay):
    """torch.optim.Adagrad: g / (sqrt(S) + eps), eps outside the root, the lr divided by
    1 + (t - 1)*lr_decay (optax.adagrad: eps inside, from 0.1, no decay)."""
    def init(params):
        return _count_state(params, "sum", fill=initial_accumulator_value)
    def update(g, s, params=None):
        acc = jax.tree.map(lambda a, x: a + x * x, s["sum"], g)
        decay = 1 + s["count"] * lr_decay
        out = jax.tree.map(lambda x, a: x / (jnp.sqrt(a) + eps) / decay, g, acc)
        return out, {"count": s["count"] + 1, "sum": acc}
    return optax.GradientTransformation(init, update)
'''

NADAM = '''
def torch_nadam(b1, b2, eps, momentum_decay):
    """torch.optim.NAdam with Dozat's momentum schedule mu_t = b1*(1 - 0.5*0.96**(t*psi)) (optax.nadam
    keeps b1 constant); mu_product in the parameters' dtype."""
    def init(params):
        return {**_count_state(params, "m", "v"), "mu_product": jnp.ones([], jax.tree.leaves(params)[0].dtype)}
    def update(g, s, params=None):
        t = s["count"] + 1
        tf = t.astype(s["mu_product"].dtype)
        mu = b1 * (1.0 - 0.5 * 0.96 ** (tf * momentum_decay))
        mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((tf + 1) * momentum_decay))
        prod = s["mu_product"] * mu
        m = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * x, s["m"], g)
        v = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * x * x, s["v"], g)
        bc2 = 1 - b2 ** tf
        def direction(x, m, v):
            den = jnp.sqrt(v / bc2) + eps
            return (1.0 - mu) / (1.0 - prod) * x / den + mu_next / (1.0 - prod * mu_next) * m / den
        out = jax.tree.map(direction, g, m, v)
        return out, {"count": t, "m": m, "v": v, "mu_product": prod}
    return optax.GradientTransformation(init, update)
'''

RADAM = '''
def torch_radam(b1, b2, eps):
    """torch.optim.RAdam: eps on the raw sqrt(v), rectified when rho_t > 5 (optax.radam: eps on
    sqrt(v_hat), rho_t >= 5)."""
    rho_inf = 2 / (1 - b2) - 1
    def init(params):
        return _count_state(params, "m", "v")
    def update(g, s, params=None):
        t = s["count"] + 1
        m = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * x, s["m"], g)
        v = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * x * x, s["v"], g)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        rho = rho_inf - 2 * t * b2 ** t / bc2
        safe = jnp.where(rho > 5.0, rho, 6.0)
        rect = jnp.sqrt((safe - 4) * (safe - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * safe))
        def direction(m, v):
            m_hat = m / bc1
            return jnp.where(rho > 5.0, m_hat * rect * jnp.sqrt(bc2) / (jnp.sqrt(v) + eps), m_hat)
        return jax.tree.map(direction, m, v), {"count": t, "m": m, "v": v}
    return optax.GradientTransformation(init, update)
'''

ADAFACTOR = '''
def torch_adafactor(lr, beta2_decay, eps1, eps2, d, weight_decay):
    """torch.optim.Adafactor (the whole update, lr included): relative step min(lr, 1/sqrt(t)),
    the last two axes factored, decay lr*wd; eps1 None = the dtype's machine epsilon."""
    def init(params):
        def leaf(p):
            if p.ndim > 1:
                return {"row": jnp.zeros(p.shape[:-1] + (1,), p.dtype), "col": jnp.zeros(p.shape[:-2] + (1,) + p.shape[-1:], p.dtype)}
            return {"var": jnp.zeros_like(p)}
        return {"count": jnp.zeros([], jnp.int32), "leaves": jax.tree.map(leaf, params)}
    def update(g, s, params):
        t = (s["count"] + 1).astype(jnp.result_type(float))
        c, rho = t ** beta2_decay, jnp.minimum(lr, 1 / jnp.sqrt(t))
        norm = lambda x, **kw: jnp.sqrt(jnp.sum(x * x, **kw))
        def leaf(x, st, p):
            e1 = jnp.finfo(p.dtype).eps if eps1 is None else eps1
            alpha = jnp.maximum(eps2, norm(p) / jnp.sqrt(p.size)) * rho
            if x.ndim > 1:
                row = st["row"] + c * (norm(x, axis=-1, keepdims=True) ** 2 / x.shape[-1] - st["row"])
                col = st["col"] + c * (norm(x, axis=-2, keepdims=True) ** 2 / x.shape[-2] - st["col"])
                var = (row @ col) / jnp.maximum(jnp.mean(row, axis=-2, keepdims=True), e1)
                new = {"row": row, "col": col}
            else:
                var = st["var"] + c * (x * x - st["var"])
                new = {"var": var}
            u = jax.lax.rsqrt(jnp.maximum(var, e1 * e1)) * x
            denom = jnp.maximum(1.0, norm(u) / (jnp.sqrt(u.size) * d))
            return -(alpha / denom) * u - lr * weight_decay * p, new
        pairs = jax.tree.map(leaf, g, s["leaves"], params)
        pair = lambda n: type(n) is tuple
        out = jax.tree.map(lambda pr: pr[0], pairs, is_leaf=pair)
        leaves = jax.tree.map(lambda pr: pr[1], pairs, is_leaf=pair)
        return out, {"count": s["count"] + 1, "leaves": leaves}
    return optax.GradientTransformation(init, update)
'''

MUON = '''
def lerp(a, b, w):
    """torch's lerp, operation for operation (bfloat16 Newton-Schulz amplifies any last-bit change);
    `w` may be traced (a scheduled momentum)."""
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


def orthogonalize(g, coefficients, steps, eps, dtype):
    """torch.optim.Muon's Newton-Schulz iteration; in bfloat16 it rounds as torch does (matmuls
    accumulate in float32, each result rounded once)."""
    a, b, c = coefficients
    low = dtype == jnp.bfloat16
    acc = jnp.float32 if low else dtype
    mm = lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST, preferred_element_type=acc)
    x = g.astype(dtype)
    tall = g.shape[0] > g.shape[1]
    x = x.T if tall else x
    norm = jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(x.astype(acc)))).astype(dtype), jnp.asarray(eps).astype(dtype))
    x = (x.astype(acc) / norm.astype(acc)).astype(dtype)
    for _ in range(steps):
        gram = mm(x, x.T).astype(dtype)
        update = (b * gram.astype(acc) + c * mm(gram, gram)).astype(dtype)
        x = (a * x.astype(acc) + mm(update, x)).astype(dtype)
    return x.T if tall else x


def torch_muon(lr, momentum, nesterov, coefficients, steps, eps, weight_decay, adjust_lr_fn, dtype, cautious=False):
    """torch.optim.Muon (the whole update, lr included) for 2-D parameters; `cautious`: the decay only
    where the step moves p toward zero (cautious weight decay, [o·p >= 0])."""
    def init(params):
        return _count_state(params, "buf")
    def update(g, s, params):
        buf = jax.tree.map(lambda b, x: lerp(b, x, 1 - momentum), s["buf"], g)
        def leaf(x, b, p):
            o = orthogonalize(lerp(x, b, momentum) if nesterov else b, coefficients, steps, eps, dtype).astype(p.dtype)
            rows, cols = p.shape
            ratio = max(1.0, rows / cols) ** 0.5 if adjust_lr_fn == "original" else 0.2 * max(rows, cols) ** 0.5
            decayed = p * (o * p >= 0).astype(p.dtype) if cautious else p
            return -(lr * ratio) * o - lr * weight_decay * decayed
        return jax.tree.map(leaf, g, buf, params), {"count": s["count"] + 1, "buf": buf}
    return optax.GradientTransformation(init, update)
'''

CLIP = '''
def clip_by_norm_torch(max_norm, eps, norm_type, per_parameter=False):
    """torch.nn.utils.clip_grad_norm_ with the spec's eps: g * min(max_norm / (n + eps), 1), n the
    norm of the per-parameter norms (optax.clip_by_global_norm has no eps: clip.eps = 0)."""
    def update(g, state, params=None):
        if per_parameter:
            return jax.tree.map(lambda x: scale(x, total_norm([x], norm_type)), g), state
        n = total_norm(jax.tree.leaves(g), norm_type)
        return jax.tree.map(lambda x: scale(x, n), g), state
    def scale(x, n):
        n = n.astype(x.dtype)
        if eps == 0:
            return jax.lax.select(n < max_norm, x, (x * (1.0 / n)) * max_norm)
        return x * jnp.minimum(max_norm / (n + eps), 1.0)
    return optax.GradientTransformation(optax.init_empty_state, update)
'''

NORM = '''
def total_norm(leaves, p):
    """torch's get_total_norm: the p-norm of the per-tensor p-norms (p = inf: the largest |g|)."""
    def one(x):
        a = jnp.abs(jnp.ravel(x))
        if a.size == 0:
            return jnp.zeros((), x.dtype)
        if math.isinf(p):
            return jnp.max(a)
        return jnp.sqrt(jnp.sum(a * a)) if p == 2 else (jnp.sum(a) if p == 1 else jnp.sum(a ** p) ** (1.0 / p))
    return one(jnp.stack([one(x) for x in leaves])) if leaves else jnp.zeros(())
'''

PRODIGY = '''
def prodigyopt_prodigy(learning_rate, betas, beta3, eps, weight_decay, decouple, use_bias_correction,
                       safeguard_warmup, d0, d_coef, growth_rate):
    """prodigyopt 1.1.2's Prodigy over the whole tree (optax.contrib.prodigy always bias-corrects
    and has no growth_rate): one d for every parameter, capped by d_max and growth_rate; while every
    gradient sum s is zero only the moments move (prodigyopt's early return); beta1 = 0 steps d·g
    with the new d, as prodigyopt does."""
    b1, b2 = betas
    leaves = jax.tree.leaves
    def init(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)
        scalar = lambda x: jnp.asarray(x, jnp.result_type(float))
        return {"m": zeros(), "v": zeros(), "s": zeros(), "p0": jax.tree.map(jnp.array, params),
                "d": scalar(d0), "d_max": scalar(d0), "num": scalar(0.0), "k": scalar(0.0)}
    def update(g, st, params):
        d, k = st["d"], st["k"]
        if not decouple:  # prodigyopt's L2 decay: into the gradient, the sums included
            g = jax.tree.map(lambda x, p: x + weight_decay * p, g, params)
        bc = jnp.sqrt(1 - b2 ** (k + 1)) / (1 - b1 ** (k + 1)) if use_bias_correction else 1.0
        dlr = d * learning_rate * bc
        p0 = jax.tree.map(lambda a, p: jnp.where(k == 0, p, a), st["p0"], params)  # the start, at the first update
        dot = sum(jnp.vdot(x, a - p) for x, a, p in zip(leaves(g), leaves(p0), leaves(params)))
        num = beta3 * st["num"] + (d / d0) * dlr * dot
        m = jax.tree.map(lambda a, x: b1 * a + d * (1 - b1) * x, st["m"], g)
        v = jax.tree.map(lambda a, x: b2 * a + d * d * (1 - b2) * x * x, st["v"], g)
        rate = (d / d0) * (d if safeguard_warmup else dlr)
        s = jax.tree.map(lambda a, x: beta3 * a + rate * x, st["s"], g)
        den = sum(jnp.sum(jnp.abs(x)) for x in leaves(s))
        go = den != 0
        d_hat = d_coef * num / jnp.where(go, den, 1.0)
        d_max = jnp.maximum(st["d_max"], d_hat)
        new_d = jnp.minimum(d_max, jnp.where(d == d0, jnp.maximum(d, d_hat), d) * growth_rate)
        def step(p, m, v, x):
            q = p + (-weight_decay * dlr) * p if decouple else p
            u = m if b1 > 0 else new_d * x
            return jnp.where(go, q - dlr * u / (jnp.sqrt(v) + new_d * eps) - p, 0.0)
        return jax.tree.map(step, params, m, v, g), {
            "m": m, "v": v, "s": s, "p0": p0,
            "d": jnp.where(go, new_d, d), "d_max": jnp.where(go, d_max, st["d_max"]),
            "num": jnp.where(go, num, st["num"]), "k": k + go}
    return optax.GradientTransformation(init, update)
'''
