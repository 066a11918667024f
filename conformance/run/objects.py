"""What `train()` was given besides the config: a model, data, a loss function (docs/your_model.md).

    config = resolve_config(config, model_given=True, data_given=True)   # [model] / [data] name = "user"
    dataset = given_dataset(config, data, loss_given=False)              # a Dataset, or None: the config's

A config that omits `[model]` trains the model passed in, one that omits `[data] name` the data
passed in; the run then records `name = "user"` for them (DIR/config.toml says what was trained,
and a resume must be given the same kind of objects again). A config that names a built-in model
or data set *and* is given one is refused, naming both. A user's model can train on a built-in
data set and a built-in model on a user's data.
"""

from __future__ import annotations

from typing import Any

from conformance.config import Config, DataSpec, ModelSpec
from conformance.config.base import validate
from conformance.data import Dataset
from conformance.errors import ConfigError


def _renamed(spec: Any, cls: type, section: str) -> Any:
    # the fields the config set, under name = "user" (a field only a built-in reads is refused)
    fields = {k: getattr(spec, k) for k in spec.model_fields_set if k != "name"}
    return validate(cls, {**fields, "name": "user"}, prefix=section)


def resolve_config(config: Config, model_given: bool, data_given: bool) -> Config:
    """The config a run with these objects records (see the module docstring)."""
    model, data = config.model, config.data
    if model_given:
        if "name" in model.model_fields_set and model.name != "user":
            raise ConfigError(f"model.name = {model.name!r} names a built-in model, and train() was also given "
                              f"model=...; omit [model] (or write name = 'user') to train the module passed in")
        model = _renamed(model, ModelSpec, "model")
    elif model.name == "user":
        raise ConfigError("model.name = 'user' is a model passed to train(..., model=...) in Python; pass it, or "
                          "name a built-in model (linear, mlp, gpt)")
    if data_given:
        if "name" in data.model_fields_set and data.name != "user":
            raise ConfigError(f"data.name = {data.name!r} names a data set, and train() was also given data=...; "
                              f"omit data.name (or write name = 'user') to train on the data passed in")
        data = _renamed(data, DataSpec, "data")
    elif data.name == "user":
        raise ConfigError("data.name = 'user' is data passed to train(..., data=...) in Python; pass it, or name a "
                          "data set")
    if model is config.model and data is config.data:
        return config
    return config.model_copy(update={"model": model, "data": data})


def given_dataset(config: Config, data: Any, loss_given: bool) -> Dataset | None:
    """The Dataset of the data passed in (or of `[data] name = "arrays"` when a loss_fn reads it, which
    needs no targets entry); None: the pipeline loads the config's data set."""
    seed = config.data.seed if config.data.seed is not None else config.run.seed
    if data is not None:
        from conformance.data.user import user_dataset

        return user_dataset(config.data, data, seed, needs_targets=not loss_given)
    if config.data.name == "arrays" and loss_given:
        from conformance.data.arrays import load_arrays

        return load_arrays(config.data, seed, needs_targets=False)
    return None
