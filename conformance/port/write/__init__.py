"""Writing the neutral spec out as runnable code with no twinstep import: torch.optim + lr_scheduler +
AMP (torch_code) or an optax chain and step function (optax_code)."""
