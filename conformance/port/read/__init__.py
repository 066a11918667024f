"""Reading native set-ups into the neutral spec: torch.optim / lr_scheduler objects (from_torch),
optax descriptions (from_optax), and foreign weights (weights.import_weights)."""
