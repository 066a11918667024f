"""twinstep's PyTorch twin: the production trainer's building blocks, on torch built-ins.

Module for module, function for function, the same public names and docstrings as ref_jax.
This package never imports jax.
"""
