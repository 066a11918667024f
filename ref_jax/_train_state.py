"""The trainer's run state and its checkpoint: restored from a checkpoint of either trainer, saved to
one, and the final weights read out.

A checkpoint holds what conformance.checkpoint defines for both trainers (docs/contract.md §5,
reliability.md §3.4's checklist): the model's tensors by neutral name in their own dtype
(parameters, frozen parameters and the model's own state, such as persistent buffers; the
parameters at a schedule-free optimizer's evaluation point x, as its package documents), the
weights' EMA ([ema]), the optimizer state in the neutral format (docs/contract.md §4's names;
"step" goes to meta["optimizer_step"]), the schedule position (counters.schedule_t) and
reduce_on_plateau's neutral state, the loss-scale state, the skip counters, every rank's
generators as `rank<i>/...` (conformance.checkpoint.rng.pack_rank_rng) and the data position (the
update count, checked against the data). What one framework does not know (torch's generator
states, a JAX key) the other ignores, so a checkpoint of either trainer resumes in the other.
"""

# The JAX trainer's state is one value: `build` makes the run's fixed pieces (Parts), and
# `initial_state` the TrainState, fresh or from a checkpoint. The generators are the JAX root key
# with the host generators; the dropout key is a pure function of run.seed and the update.

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from conformance.checkpoint import check_tensors, dim0_slice, whole
from conformance.checkpoint.rng import gather_rng, pack_rank_rng, unpack_rank_rng
from conformance.config import Config
from conformance.data import DataInfo
from conformance.errors import CheckpointError
from conformance.rules import plateau
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import start_lrs
from conformance.run import records
from conformance.run.pretrained import initial_weights
from conformance.run.session import Run
from conformance.run.validate import check_optimizer_entries
from ref_jax import _model, backend
from ref_jax._parallel import Placement, gather_bytes, host_array
from ref_jax._schedules import (
    PlateauState,
    plateau_from_neutral,
    plateau_init,
    plateau_neutral,
    plateau_step,
)
from ref_jax._train_step import TrainState
from ref_jax._update import UpdateState
from ref_jax._window import WindowLayout, rows_for
from ref_jax.checkpoint import capture_rng, restore_rng
from ref_jax.ema import EmaState, export_ema, import_ema, init_ema
from ref_jax.optimizers import (
    build_optimizer,
    export_state,
    import_state,
    to_eval_point,
    to_train_point,
)
from ref_jax.precision import (
    Policy,
    SkipState,
    get_policy,
    init_scale_state,
    init_skip_state,
    scale_state_from_dict,
    scale_state_to_dict,
)
from ref_jax.schedules import schedule_values


class Parts(NamedTuple):
    """The run's fixed pieces: the model as a pure function, its initial parameters, the dtype
    policy, the optimizer, the schedule's values per position (schedule_tables), the window
    layout, and the model's initial non-parameter state with a way to write final values back into
    a user's module (ref_jax._model)."""

    apply: Any
    params: dict[str, Any]
    policy: Policy
    tx: Any
    tables: dict[str, np.ndarray]
    layout: WindowLayout
    eval_rows: int
    state: dict[str, Any]
    write_back: Any


def build(config: Config, info: DataInfo, place: Placement, updates_per_epoch: int, planned: int,
          model: Any = None) -> Parts:
    """Model (the built-in one with conformance.rules.models.init_params(model, data, run.seed):
    torch's initial weights; or the user's `model`), optimizer, schedules and window layout."""
    policy = get_policy(config.precision)
    m = _model.make(config, info, model)
    params = m.params
    tx = build_optimizer(config.optimizer, params)
    tables = schedule_tables(config, updates_per_epoch, planned)
    real = backend.framework_dtype(config.precision.param_dtype)
    # each process lays out its own part of a micro-batch (data.batch_size rows) over its devices
    layout = WindowLayout(config.accumulation.steps, rows_for(config.data.batch_size, place.local_count), real,
                          info.task == "language_model")
    eval_rows = rows_for(config.data.eval_batch_size or config.data.batch_size, place.local_count)
    return Parts(m.apply, params, policy, tx, tables, layout, eval_rows, m.state, m.write_back)


def schedule_tables(config: Config, updates_per_epoch: int, planned: int) -> dict[str, np.ndarray]:
    """The schedule at every position 0 .. planned-1 ({"lr": [planned, groups], "momentum" when
    onecycle cycles momentum or beta1, "hyper.<key>" for [schedule.hyper]}): the optax schedules evaluated in float64 (as torch computes
    its lr in double precision), then rounded to the parameter dtype."""
    per_epoch = updates_per_epoch if config.schedule.unit == "epoch" else 1
    with jax.enable_x64(True):
        values = schedule_values(config.schedule, config.optimizer, planned, per_epoch)
    dtype = backend.framework_dtype(config.precision.param_dtype)
    tables = {"lr": np.asarray(values["lr"]).astype(dtype)}
    if values["momentum"] is not None:
        tables["momentum"] = np.asarray(values["momentum"]).astype(dtype)
    for key, table in values["hyper"].items():  # [schedule.hyper]: NaN in the groups that do not read the key
        tables[f"hyper.{key}"] = np.asarray(table).astype(dtype)
    return tables


def plateau_start(config: Config, run: Run) -> PlateauState | None:
    """reduce_on_plateau's state: fresh (every group at its base lr) or the checkpoint's; None for
    other schedules. Float64 (x64), as torch keeps its lrs and best metric in Python floats."""
    if config.schedule.name != "reduce_on_plateau":
        return None
    base = start_lrs(config.schedule, group_base_lrs(config.optimizer))
    with jax.enable_x64(True):
        if run.checkpoint is None:
            return plateau_init(config.schedule, base)
        found = run.checkpoint
        return plateau_from_neutral(plateau.from_meta(found.state.meta or {}, len(base), str(found.path)))


def plateau_observe(config: Config, state: PlateauState, metric: float) -> PlateauState:
    """One evaluation's metric observed (ref_jax._schedules.plateau_step, in float64)."""
    with jax.enable_x64(True):
        return plateau_step(config.schedule, state, jnp.asarray(metric, jnp.float64))


def plateau_tables(parts: Parts, state: PlateauState) -> dict[str, np.ndarray]:
    """The schedule tables with every position at the plateau's current lrs (same shape and dtype as
    parts.tables, so the compiled step is reused)."""
    lr = parts.tables["lr"]
    current = np.asarray(state.lrs, np.float64).astype(lr.dtype)
    return {**parts.tables, "lr": np.ascontiguousarray(np.broadcast_to(current, lr.shape))}


def _expected(params: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {n: (tuple(p.shape), jnp.dtype(p.dtype).name) for n, p in params.items()}


def initial_state(parts: Parts, run: Run, place: Placement) -> tuple[TrainState, Any]:
    """(TrainState, root key): fresh, or the checkpoint `run` resumes from (either trainer's)."""
    config = run.config
    key = jax.random.key(config.run.seed)
    params, model_state = parts.params, parts.state
    if run.checkpoint is None and config.model.init is not None:  # a resume has its own weights
        params = _model.load_pretrained(params, initial_weights(config, run.data.info))
    opt_state = parts.tx.init(params)
    scale = init_scale_state(config.precision)
    skips = init_skip_state()
    found = run.checkpoint
    if found is not None:
        saved = whole(found).state  # a sharded checkpoint's slices assembled
        check_tensors({**_expected(params), **_model.expected(model_state)}, saved.model)
        params = {n: jnp.asarray(np.asarray(saved.model[n])) for n in params}
        model_state = _model.from_tensors(model_state, saved.model)
        meta = saved.meta or {}
        # a user's model: its trainable parameters, which only the live model knows, all have their state
        check_optimizer_entries(found.path / "optimizer.safetensors", params, saved.optimizer or {},
                                int(meta.get("optimizer_step", 0)))
        opt_state = import_state(parts.tx.init(params), {"step": meta.get("optimizer_step", 0),
                                                         "state": saved.optimizer or {}})
        # the saved weights are a schedule-free optimizer's x, as between any two updates (ref_jax.trainer)
        if config.precision.dynamic_scaling:
            if not isinstance(meta.get("loss_scale"), dict):
                raise CheckpointError(f"{found.path}: state.json has no loss_scale, but this run scales the loss "
                                      f"dynamically")
            scale = scale_state_from_dict(meta["loss_scale"])
        c = run.counters
        skips = SkipState(jnp.asarray(c.skipped_total, jnp.int32), jnp.asarray(c.consecutive_skips, jnp.int32))
        mine = unpack_rank_rng(saved.rng or {}, meta.get("rng") or {}, 0)
        restored = restore_rng(*mine) if mine is not None else None
        if restored is not None:
            key = restored  # a torch checkpoint holds no JAX key: the seed's key is the same one
    position = run.counters.schedule_t
    update = UpdateState(params, opt_state, scale, skips, model_state or None)
    state = TrainState(update, jnp.asarray(position, jnp.int32))
    return place.put_replicated(state), place.put_replicated(key)


def initial_ema(config: Config, params: dict[str, Any], run: Run, place: Placement) -> EmaState | None:
    """The weights' EMA ([ema]): fresh, or the checkpoint's; None without an EMA."""
    ema = init_ema(config.ema, params)
    if ema is not None and run.checkpoint is not None:
        ema = import_ema(ema, whole(run.checkpoint).state.ema)
    return None if ema is None else place.put_replicated(ema)


def at_point(state: TrainState, train: bool) -> TrainState:
    """The state with a schedule-free optimizer's parameters moved to its gradient point y
    (`train`, at the start of an update) or to x (after it: between updates the trainer holds x, so
    evaluations, saves and preemption read it as it is and never round y); others unchanged."""
    opt_state = state.update.opt_state
    params = (to_train_point if train else to_eval_point)(opt_state, state.update.params)
    return state._replace(update=state.update._replace(params=params))


def params_numpy(state: TrainState) -> dict[str, np.ndarray]:
    """The parameters as NumPy arrays in their own dtype, by neutral name."""
    return {n: host_array(p) for n, p in state.update.params.items()}


def model_numpy(state: TrainState) -> dict[str, np.ndarray]:
    """What a checkpoint's model holds: the parameters and the model's own state, by neutral name."""
    model_state = state.update.model_state or {}
    if jax.process_count() > 1:  # a global array's local copy (to_tensors reads it on the host)
        model_state = {n: jax.random.wrap_key_data(host_array(jax.random.key_data(v)))
                       if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else host_array(v)
                       for n, v in model_state.items()}
    return {**params_numpy(state), **_model.to_tensors(model_state)}


def _versions(place: Placement) -> dict[str, Any]:
    """Library versions, PRNG/numerics flags and the devices of the mesh, for the manifest."""
    d = backend.describe()
    out = {k: str(d[k]) for k in ("jax", "optax", "flax", "threefry_partitionable", "default_matmul_precision")}
    return {**out, "jax_devices": ",".join(str(x) for x in place.devices)}


def save_checkpoint(run: Run, place: Placement, state: TrainState, key: Any, updates_done: int,
                    val_loss: float | None, plateau_state: PlateauState | None = None,
                    ema: EmaState | None = None) -> Path | None:
    """Write the checkpoint after `updates_done` updates (see the module docstring): the weights as
    they are between updates (a schedule-free optimizer's evaluation point x), reduce_on_plateau's
    state in its neutral form when the run has one, and the EMA ([ema]). Collective: every rank
    calls it (the generators are gathered); rank 0's path, else None."""
    config = run.config
    opt_state = jax.tree.map(host_array, state.update.opt_state) if place.processes > 1 else state.update.opt_state
    exported = export_state(opt_state)
    scale = scale_state_to_dict(jax.tree.map(host_array, state.update.scale)) \
        if config.precision.dynamic_scaling else None
    mine = capture_rng(jax.random.wrap_key_data(host_array(jax.random.key_data(key))))
    rng, rng_meta = pack_rank_rng(gather_rng(*mine, gather_bytes) if place.processes > 1 else [mine])
    neutral = None if plateau_state is None else plateau.to_json(plateau_neutral(plateau_state))
    meta = records.checkpoint_meta(run, updates_done, exported["step"], scale, rng_meta, neutral)
    model = model_numpy(state)
    if place.processes > 1:  # every process writes its rows of every tensor (the sharded layout)
        return records.save_sharded(run, updates_done, row_pieces(model, exported["state"], export_ema(ema),
                                                                  run.rank, run.world_size),
                                    rng, meta, _versions(place), gather_bytes, val_loss)
    return records.save(run, updates_done, model, exported["state"], rng, meta, _versions(place), val_loss,
                        ema=export_ema(ema))


def row_pieces(model: dict[str, np.ndarray], optimizer: dict[str, dict[str, np.ndarray]],
               ema: dict[str, np.ndarray] | None, rank: int, world: int) -> dict[str, Any]:
    """This process's pieces of replicated whole tensors: rows dim0_slice(n, rank, world) of each
    (0-d tensors whole: rank 0 writes them), as conformance.checkpoint.save_sharded takes them."""
    flat = {**{f"model/{k}": v for k, v in model.items()}, **{f"ema/{k}": v for k, v in (ema or {}).items()},
            **{f"optimizer/{p}/{k}": v for p, e in optimizer.items() for k, v in e.items()}}
    out = {}
    for key, value in flat.items():
        value = np.asarray(value)
        if value.ndim == 0:
            out[key] = (value, (), ())
            continue
        a, b = dim0_slice(value.shape[0], rank, world)
        out[key] = (value[a:b], value.shape, (a,) + (0,) * (value.ndim - 1))
    return out
