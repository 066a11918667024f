"""The Keras references of tools/gen_optimizer_cases.py: Keras 3's own optimizers and test goldens.

`run_keras` steps `keras.optimizers.<Class>` on its JAX backend in float64 (floatx float64, so that
the learning rate, weight decay and EMA momentum are float64 too) and returns the parameters after
every update (Keras keeps no per-parameter count and names its state otherwise: no state). A
twinstep spec is translated to Keras's constructor only where the spec states Keras's semantics
(`keras_semantics` refuses anything else): weight decay decoupled (Keras decays every optimizer as
p ← p − lr·wd·p before the step), Adam/AdamW/Adamax with eps_hat, RMSprop/Adagrad with the eps
inside the square root, Nadam with momentum_decay = 1 (Keras's Dozat schedule is 0.96^t).

`GOLDENS` are the `test_correctness_with_golden` tables of keras/src/optimizers/*_test.py (keras
3.15.1): the first update with gradient 0.01, then four with 0.1, 0.2, ..., 1.0, on ten parameters
at 1.0, quoted to 4 decimals and checked at rtol = atol = 5e-4 as Keras checks them.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

KERAS_CLASSES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "adamax": "Adamax", "nadam": "Nadam",
                 "rmsprop": "RMSprop", "adagrad": "Adagrad", "lion": "Lion"}


def keras_semantics(spec: dict[str, Any]) -> None:
    """Refuse a spec that does not mean what the Keras class computes (a generator bug, not data)."""
    name, wd = spec["name"], spec.get("weight_decay", 0.0)
    if wd and name in ("sgd", "adam", "adamax", "nadam", "rmsprop", "adagrad") and not spec.get("decoupled_weight_decay"):
        raise ValueError(f"{name}: Keras decays decoupled; the spec needs decoupled_weight_decay = true")
    if name in ("adam", "adamw", "adamax") and not spec.get("eps_hat"):
        raise ValueError(f"{name}: Keras places eps as eps_hat; the spec needs eps_hat = true")
    if name in ("rmsprop", "adagrad") and not spec.get("eps_in_sqrt"):
        raise ValueError(f"{name}: Keras puts eps inside the square root; the spec needs eps_in_sqrt = true")
    if name == "nadam" and spec.get("momentum_decay") != 1.0:
        raise ValueError("nadam: Keras's schedule is 0.96^t, the spec needs momentum_decay = 1.0")
    if name == "sgd" and spec.get("dampening", 0.0):
        raise ValueError("sgd: Keras has no dampening")


def keras_optimizer(spec: dict[str, Any], ema: dict[str, Any] | None = None) -> Any:
    import keras

    keras_semantics(spec)
    name = spec["name"]
    kw: dict[str, Any] = {"learning_rate": spec["lr"], "weight_decay": spec.get("weight_decay") or None}
    if ema is not None:  # Keras's EMA is updated after every update from the first: every = 1, start = 0
        if ema.get("every", 1) != 1 or ema.get("start", 0) != 0:
            raise ValueError("Keras's use_ema has no every / start")
        kw.update(use_ema=True, ema_momentum=ema["decay"])
    b1, b2 = spec.get("betas", (0.9, 0.999))
    if name == "sgd":
        kw.update(momentum=spec.get("momentum", 0.0), nesterov=spec.get("nesterov", False))
    elif name in ("adam", "adamw", "adamax", "nadam"):
        kw.update(beta_1=b1, beta_2=b2, epsilon=spec.get("eps", 1e-8))
        if name in ("adam", "adamw"):
            kw["amsgrad"] = spec.get("amsgrad", False)
        if name == "adamw":
            kw["weight_decay"] = spec.get("weight_decay", 1e-2)
    elif name == "rmsprop":
        kw.update(rho=spec.get("alpha", 0.99), momentum=spec.get("momentum", 0.0), epsilon=spec.get("eps", 1e-8),
                  centered=spec.get("centered", False))
    elif name == "adagrad":
        kw.update(initial_accumulator_value=spec.get("initial_accumulator_value", 0.0), epsilon=spec.get("eps", 1e-10))
    elif name == "lion":
        kw.update(beta_1=b1, beta_2=b2)
    return getattr(keras.optimizers, KERAS_CLASSES[name])(**kw)


def run_keras(spec: dict[str, Any], params: dict[str, Any], grads: list[dict] | None, objective: dict | None,
              steps: int | None, ema: dict[str, Any] | None = None) -> tuple[list[dict], None] | list[dict]:
    """The parameters after each update (and no state); with `ema`, the EMA after each update
    instead (Keras's _model_variables_moving_average)."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax

    jax.config.update("jax_enable_x64", True)
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError("the Keras reference runs on the JAX backend (KERAS_BACKEND=jax)")
    keras.config.set_floatx("float64")
    opt = keras_optimizer(spec, ema)
    if spec.get("no_weight_decay"):
        opt.exclude_from_weight_decay(var_names=[p.replace("*", "") for p in spec["no_weight_decay"]])
    names = list(params)
    variables = [keras.Variable(np.asarray(params[n], np.float64), dtype="float64", name=n) for n in names]
    out = []
    for k in range(len(grads) if grads is not None else steps):
        if grads is not None:
            g = [np.asarray(grads[k][n], np.float64) for n in names]
        else:
            g = [np.asarray(objective["curvature"][n]) * (np.asarray(v) - np.asarray(objective["center"][n]))
                 for n, v in zip(names, variables)]
        opt.apply_gradients(zip(g, variables))
        values = opt._model_variables_moving_average if ema is not None else variables
        out.append({n: np.asarray(v, np.float64).copy() for n, v in zip(names, values)})
    return out if ema is not None else (out, None)


_G = 0.01, np.arange(0.1, 1.1, 0.1)[:10]  # first gradient, then the same gradient four times
GOLDENS: dict[str, tuple[dict[str, Any], list[list[float]]]] = {
    # name: (twinstep spec with Keras's constructor values and semantics, golden rows)
    "adam": ({"name": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-7, "amsgrad": True, "eps_hat": True},
             [[0.999] * 10, [0.9982] * 10, [0.9974] * 10, [0.9965] * 10, [0.9955] * 10]),
    "adamw": ({"name": "adamw", "lr": 1.0, "betas": [0.9, 0.999], "eps": 2.0, "weight_decay": 0.5, "eps_hat": True},
              [[0.4998] * 10,
               [0.2486, 0.2475, 0.2463, 0.2451, 0.244, 0.2428, 0.2417, 0.2405, 0.2394, 0.2382],
               [0.1223, 0.1198, 0.1174, 0.1149, 0.1124, 0.11, 0.1075, 0.1051, 0.1027, 0.1003],
               [0.0586, 0.0549, 0.0512, 0.0475, 0.0439, 0.0402, 0.0366, 0.033, 0.0294, 0.0258],
               [0.0263, 0.0215, 0.0167, 0.012, 0.0073, 0.0026, -0.0021, -0.0067, -0.0113, -0.0159]]),
    "adamax": ({"name": "adamax", "lr": 0.2, "betas": [0.85, 0.95], "eps": 1e-6, "eps_hat": True},
               [[0.8] * 10,
                [0.6827, 0.6873, 0.6888, 0.6896, 0.6901, 0.6904, 0.6906, 0.6908, 0.6909, 0.691],
                [0.5333, 0.5407, 0.5431, 0.5444, 0.5451, 0.5456, 0.546, 0.5462, 0.5464, 0.5466],
                [0.368, 0.3773, 0.3804, 0.382, 0.3829, 0.3835, 0.384, 0.3843, 0.3846, 0.3848],
                [0.1933, 0.204, 0.2076, 0.2094, 0.2105, 0.2112, 0.2117, 0.2121, 0.2124, 0.2126]]),
    "nadam": ({"name": "nadam", "lr": 0.5, "betas": [0.5, 0.67], "eps": 1e-5, "momentum_decay": 1.0},
              [[0.4281] * 10,
               [-0.1738, -0.1731, -0.1726, -0.1723, -0.1721, -0.172, -0.1719, -0.1718, -0.1718, -0.1717],
               [-0.7115, -0.7103, -0.7096, -0.7092, -0.709, -0.7088, -0.7086, -0.7085, -0.7085, -0.7084],
               [-1.2335, -1.2322, -1.2313, -1.2309, -1.2306, -1.2304, -1.2302, -1.2301, -1.23, -1.2299],
               [-1.7492, -1.7478, -1.7469, -1.7464, -1.7461, -1.7459, -1.7457, -1.7456, -1.7455, -1.7454]]),
    "rmsprop": ({"name": "rmsprop", "lr": 1e-3, "alpha": 0.9, "eps": 1e-7, "centered": True, "eps_in_sqrt": True},
                [[0.9967] * 10, [0.9933] * 10, [0.9908] * 10, [0.9885] * 10, [0.9864] * 10]),
    "adagrad": ({"name": "adagrad", "lr": 0.2, "initial_accumulator_value": 0.3, "eps": 1e-6, "eps_in_sqrt": True},
                [[0.9963] * 10,
                 [0.9604, 0.9278, 0.9003, 0.8784, 0.8615, 0.8487, 0.8388, 0.8313, 0.8255, 0.8209],
                 [0.9251, 0.8629, 0.8137, 0.7768, 0.7497, 0.7298, 0.7151, 0.704, 0.6956, 0.6891],
                 [0.8903, 0.8012, 0.7342, 0.6862, 0.6521, 0.6277, 0.6099, 0.5967, 0.5867, 0.579],
                 [0.856, 0.7422, 0.6604, 0.6037, 0.5644, 0.5367, 0.5168, 0.5021, 0.491, 0.4825]]),
}


def golden_inputs() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The goldens' parameters and the five gradients (the fifth update's result is not checked by
    Keras's test: the table has the state after updates 0..4)."""
    first, rest = _G
    return {"x": np.ones(10)}, [{"x": np.full(10, first)}] + [{"x": rest.copy()} for _ in range(4)]
