"""The NumPy float64 oracle: every piece of the pipeline written straight from its equations.

It has the same module and function names as ref_torch and ref_jax (losses.loss_value_and_grad,
...), so the harness runs it as a third backend.
"""
