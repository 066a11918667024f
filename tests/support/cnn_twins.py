"""One small CNN written twice, as a user would: torch (`TorchCNN`) and Flax NNX
(`NnxCNN`, built from the torch module's initial weights), for the bundled 8×8 digits.

The NNX twin stores its weights in torch's layout (conv [out, in, kh, kw] over NCHW inputs, linear
[out, in]) so the arrays move unchanged; its classifier is called `head` where torch's is `fc`, and
RENAME maps its names to torch's: `[model] rename` in the config both frameworks run.
`NnxCNN(..., pool="max")` is the deliberately wrong twin of the negative control.
"""

from __future__ import annotations

from typing import Any

import numpy as np

RENAME = {"head.weight": "fc.weight", "head.bias": "fc.bias"}


def torch_cnn(seed: int = 0) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class TorchCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3)  # 8x8 -> 6x6
            self.conv2 = nn.Conv2d(8, 16, 3)  # 6x6 -> 4x4, pooled to 2x2
            self.fc = nn.Linear(16 * 2 * 2, 10)

        def forward(self, x: Any) -> Any:
            x = torch.relu(self.conv1(x.reshape(-1, 1, 8, 8)))
            x = F.avg_pool2d(torch.relu(self.conv2(x)), 2)
            return self.fc(x.flatten(1))

    torch.manual_seed(seed)
    return TorchCNN()


def nnx_cnn(weights: dict[str, np.ndarray], pool: str = "avg") -> Any:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class Conv(nnx.Module):  # torch's Conv2d: weight [out, in, kh, kw], NCHW, no padding
        def __init__(self, w: np.ndarray, b: np.ndarray) -> None:
            self.weight, self.bias = nnx.Param(jnp.asarray(w)), nnx.Param(jnp.asarray(b))

        def __call__(self, x: Any) -> Any:
            y = jax.lax.conv_general_dilated(x, self.weight[...], (1, 1), "VALID",
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return y + self.bias[...][None, :, None, None]

    class Dense(nnx.Module):  # torch's Linear: weight [out, in]
        def __init__(self, w: np.ndarray, b: np.ndarray) -> None:
            self.weight, self.bias = nnx.Param(jnp.asarray(w)), nnx.Param(jnp.asarray(b))

        def __call__(self, x: Any) -> Any:
            return x @ self.weight[...].T + self.bias[...]

    class NnxCNN(nnx.Module):
        def __init__(self) -> None:
            self.conv1 = Conv(weights["conv1.weight"], weights["conv1.bias"])
            self.conv2 = Conv(weights["conv2.weight"], weights["conv2.bias"])
            self.head = Dense(weights["fc.weight"], weights["fc.bias"])

        def __call__(self, x: Any) -> Any:
            x = jax.nn.relu(self.conv1(x.reshape(-1, 1, 8, 8)))
            x = jax.nn.relu(self.conv2(x))
            n, c, h, w = x.shape
            blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
            x = blocks.mean(axis=(3, 5)) if pool == "avg" else blocks.max(axis=(3, 5))
            return self.head(x.reshape(n, -1))

    return NnxCNN()


def twins(seed: int = 0, pool: str = "avg") -> tuple[Any, Any]:
    """(torch module, NNX module) with the same initial weights."""
    t = torch_cnn(seed)
    weights = {k: v.detach().numpy().copy() for k, v in t.state_dict().items()}
    return t, nnx_cnn(weights, pool)
