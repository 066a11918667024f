"""keras: Keras 3's own optimizers, losses and schedules as a conformance backend, on Keras's JAX
backend in float64 (natives/__init__.py for the mapping rule; `pip install twinstep[keras]`).

Keras is imported when a case first needs it, with KERAS_BACKEND=jax unless the environment already
chose a backend (then it must be jax). Keras's semantics that the spec cannot express yet (epsilon
hat, decoupled weight decay on every optimizer, last-axis loss means) run as Keras computes them and
each is a docs/divergences.md row (section "Keras 3") naming the cases it fails.
"""

import os
from importlib.util import find_spec

# checked when `--backend keras` is resolved, so a missing or mis-configured Keras is one line, exit 2
if find_spec("keras") is None:
    raise ImportError("the keras backend needs Keras 3: pip install 'twinstep[keras]'")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    raise ImportError(f"the keras backend runs Keras on JAX; KERAS_BACKEND={os.environ['KERAS_BACKEND']}")
