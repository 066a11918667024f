"""twinstep's JAX twin: the same building blocks on jax, optax and flax.

Module for module, function for function, the same public names and docstrings as ref_torch.
This package never imports torch.
"""
