"""optax-native: optax's own building blocks as a conformance backend, written the way an optax user
ports a torch set-up (natives/__init__.py for the mapping rule; docs/divergences.md for the recipes):
optax aliases, optax schedules, optax.losses, optax.clip / clip_by_global_norm and MultiSteps."""
