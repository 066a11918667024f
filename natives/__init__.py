"""The frameworks' own built-ins as conformance backends (docs/backends.md, "Native backends").

`torch-native` (`natives.torch_native`: torch.optim, lr_scheduler, torch.nn.functional,
clip_grad_norm_ / clip_grad_value_, GradScaler, plain accumulation), `optax-native`
(`natives.optax_native`: optax aliases, schedules, optax.losses, clipping, MultiSteps) and `keras`
(`natives.keras_backend`: Keras 3 optimizers, losses and schedules on its JAX backend) build each
case's spec from the framework's public API, with no twinstep mathematics: from `conformance` they
use the spec (`conformance.config`), the error classes, and the host-side input checks and group
resolution of `conformance.rules` (tests/test_architecture.py holds the allow-list).

How a spec field is mapped (the same rule on every native backend, `natives._protocol`):

1. a field the framework has an argument for is passed to it (torch's names; optax's and Keras's
   per docs/divergences.md and reference/semantics.md);
2. a field the framework has no argument for: at the spec's default (torch's behaviour, never
   asked for explicitly) the framework's own behaviour runs, so where it differs the case fails
   and a docs/divergences.md row names that case; at any other value the case is unsupported,
   with the field and the reason.

A case whose kind the framework has no counterpart for (a whole training run) is unsupported.
`tests/test_native_backends.py` runs the bundled suite on each and keeps the ledger true.
"""
