"""`from_torch`: a torch.optim optimizer (and lr_scheduler) as twinstep's spec sections.

    spec = from_torch(optimizer, scheduler, model.named_parameters())
    config = load_config({**spec, "model": ...})     # validates with the strict spec
    spec.position                                    # the update the native objects perform next

torch is imported lazily: conformance stays importable without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.errors import ConfigError, UnsupportedError
from conformance.port.read.torch_loop import accumulation_section, clip_section, precision_section
from conformance.port.read.torch_optim import optimizer_section
from conformance.port.read.torch_sched import read_scheduler


class Ported(dict):
    """The spec sections as a plain dict ({"optimizer": ..., "schedule": ...}), plus `position`:
    the update the native objects perform next (a stepped scheduler's `last_epoch`; 0 when fresh).
    Continue the run there: twinstep's schedule at update `position + t` is the native lr of the
    t-th update from now (torch backend: build_scheduler(..., start=position))."""

    position: int = 0


def validated(sections: dict[str, Any], what: str) -> dict[str, Any]:
    """Check the sections with the strict spec; a refusal names what was translated."""
    from conformance.config import Config, validate

    try:
        validate(Config, sections)
    except ConfigError as exc:
        raise UnsupportedError(f"{what} has no twinstep equivalent: {exc}") from None
    return sections


def check_position(sections: dict[str, Any], optimizer: Any, position: int) -> None:
    """The translated schedule must give each group's current lr (and cycled momentum) at `position`:
    anything else means something besides the scheduler changed them (a manual edit, a second
    scheduler, step(epoch)), which the translation would silently lose."""
    from conformance.config import load_config
    from conformance.oracle.schedules import lr_function, momentum_function
    from conformance.rules.groups import group_base_lrs
    from conformance.rules.schedules import cycled_hyperparameter, start_lrs

    config = load_config(sections)
    s = np.asarray([position])
    bases = start_lrs(config.schedule, group_base_lrs(config.optimizer))
    groups = optimizer.param_groups
    if config.optimizer.name == "muon":
        bases = bases[::2]  # muon's layout pairs every group with its fallback part
    for i, (group, base) in enumerate(zip(groups, bases)):
        want, got = float(lr_function(config.schedule, base)(s)[0]), float(group["lr"])
        if not np.isclose(got, want, rtol=1e-10, atol=1e-300):
            raise UnsupportedError(
                f"optimizer.param_groups[{i}]['lr'] = {got!r}, but the scheduler's own schedule gives {want!r} "
                f"at update {position}: something besides the scheduler changed it (a manual edit, another "
                f"scheduler, step(epoch)), which twinstep cannot express")
    cycled = cycled_hyperparameter(config.schedule, config.optimizer)
    if cycled is not None:
        want = float(momentum_function(config.schedule)(s)[0])
        for i, group in enumerate(groups):
            got = float(group["betas"][0] if cycled == "beta1" else group["momentum"])
            if not np.isclose(got, want, rtol=1e-10):
                raise UnsupportedError(f"optimizer.param_groups[{i}] {cycled} = {got!r}, but the scheduler gives "
                                       f"{want!r} at update {position}: something else changed it")


def _cycled_start(section: dict[str, Any], schedule: dict[str, Any]) -> None:
    """OneCycleLR / CyclicLR overwrite momentum (or beta1) at every update: write the value they
    start from (max_momentum) rather than wherever a stepped scheduler left it."""
    if schedule.get("name") not in ("onecycle", "cyclic") or not schedule.get("cycle_momentum"):
        return
    top = schedule["max_momentum"]
    for table in [section, *section.get("groups", [])]:
        if "betas" in table:
            table["betas"] = [top, table["betas"][1]]
        elif "momentum" in table:
            table["momentum"] = top
    for group in section.get("groups", []):
        for key in ("betas", "momentum"):
            if key in group and group[key] == section.get(key):
                del group[key]


def from_torch(optimizer: Any, scheduler: Any = None, named_parameters: Any = None, *, scaler: Any = None,
               clip: Any = None, accumulation: int | None = None, sample_updates: int | None = None) -> Ported:
    """The spec sections of a torch.optim optimizer and (optionally) its lr_scheduler, exactly.

    `named_parameters`: the model (or its named_parameters(), or a {name: tensor} mapping) that
    names the tensors; needed when the optimizer has several param groups (each becomes an
    `[[optimizer.groups]]` entry of glob patterns, the last group the top-level values), unless
    the optimizer was built from named parameters. Returns a `Ported` dict with "optimizer"
    (and "schedule" when a scheduler is given) and `.position`. Anything twinstep cannot express
    exactly (an unknown class or a subclass that changes the step, a ChainedScheduler part that
    does not multiply, a ReduceLROnPlateau that has observed metrics, differentiable = True, a
    parameter with a gradient outside the optimizer, ...) raises UnsupportedError naming it and why. The rest of the loop (conformance/port/read/torch_loop.py):
    `scaler` a torch.amp.GradScaler -> [precision], `clip` the loop's clip_grad_norm_ /
    clip_grad_value_ arguments -> [clip], `accumulation` its micro-batches per step -> [accumulation].
    `sample_updates`: the run's updates, over which a LambdaLR / MultiplicativeLR whose lr_lambda is
    not one of transformers' schedule functions is sampled into a `tabulated` schedule (a warning
    names the length; without it such a scheduler is refused)."""
    if sample_updates is not None and (isinstance(sample_updates, bool) or not isinstance(sample_updates, int)
                                       or sample_updates < 1):
        raise ConfigError(f"sample_updates must be a whole number of updates >= 1; received {sample_updates!r}")
    read = read_scheduler(scheduler, optimizer, sample_updates) if scheduler is not None else None
    out = Ported(optimizer=optimizer_section(optimizer, named_parameters, read.lrs if read else None))
    if scaler is not None:
        out["precision"] = precision_section(scaler)
    if clip is not None:
        out["clip"] = clip_section(clip)
    if accumulation is not None:
        out["accumulation"] = accumulation_section(accumulation)
    if read is None:
        return Ported(validated(dict(out), f"torch.optim.{type(optimizer).__name__}"))
    out["schedule"] = read.schedule
    _cycled_start(out["optimizer"], read.schedule)
    validated(dict(out), f"torch.optim.lr_scheduler.{type(scheduler).__name__}")
    check_position(dict(out), optimizer, read.position)
    out.position = read.position
    return out
