"""The twins' private modules are twins too: every private module name both ref_torch and ref_jax
have (`_update`, `_model`, ...) has the same module docstring and the same top-level definitions
in the same order, each with the same docstring and, for functions, methods and NamedTuples, the
same signature and fields; a same-named type means the same thing on both sides.

What is compared: the names a module defines at the top level without a leading underscore
(functions, classes, NamedTuples, constants and type aliases), because those are what the twin's
other modules call, so they are where a reader expects the twins to meet. `_helpers` are not
compared: they are how each framework carries out a shared job (torch's `_step` around
optimizer.step(), JAX's `_with_hyperparams` around an optax state), and comparing them would make the
allow-list a second copy of the code.

The exceptions are written down, each with its reason: `FRAMEWORK_ONLY` (a definition that exists on
one side only, because the other framework does that job differently or not at all) and
`OWN_SIGNATURES` (a shared definition whose parameters differ, because one framework needs an
argument the other does not). `NOT_YET_ALIGNED` lists the pairs that are not twins yet, with the
reason; it may only shrink, and a pair that becomes twins must leave it (a test says so).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from test_twins import _compare_classes, _compare_functions, _doc

import ref_jax
import ref_torch

# Pairs that are not twins yet, with why; only ever shrinks (see WAS_NOT_ALIGNED).
NOT_YET_ALIGNED: tuple[tuple[str, str], ...] = (
    ("_assembly", "no shared definition yet: torch assembles torch.optim objects, JAX one optax transform over "
                  "ref_jax._elementwise (its owners' file)"),
    ("_elementwise", "being edited by its owners in this checkout; aligned after their change lands"),
)

# Every pair that was in NOT_YET_ALIGNED when this file was written: the list may lose entries only.
WAS_NOT_ALIGNED = frozenset({
    "_assembly", "_clip_transforms", "_elementwise", "_model", "_muon", "_parallel", "_schedule_free",
    "_schedules", "_steps", "_train_state", "_update",
})

_OPTAX_CHAIN = "optax's clipping is a GradientTransformation in an optax.chain; torch clips the gradients in place"
_NORMS = "torch.nn.utils.get_total_norm; optax has no p-norm of a pytree"
_MODULE_HOLDS = "a torch module holds its tensors, reached by name; JAX's arrays are Model.params and .state"
_EAGER_LOSS = "torch computes a micro-batch's loss eagerly on the module; JAX's loss is traced in ref_jax._train_step"
_KEYS = "an NNX module's state holds typed PRNG keys, checkpointed as key data; torch's buffers are plain tensors"
_SF_CLASSES = ("a torch optimizer is a torch.optim.Optimizer class (eval() / train() move its parameters in place); "
               "JAX's is an init / update pair of per-parameter pure functions (OPTIMIZERS on both sides)")
_SF_LEAF = ("one parameter's pure init / update and its state, dispatched to by ref_jax._elementwise; torch's "
            "optimizer classes keep a state dict per parameter and update in place")
_SF_POINTS = ("one parameter's x or y as a new array; torch's optimizer moves all its parameters in place by its "
              "eval() / train()")
_COUNT = ("an optax schedule is a pure function of the update count; torch's scheduler is an object stepped "
          "once per update that sets its optimizer's lrs")
_PURE_PLATEAU = ("torch's ReduceLROnPlateau keeps its state in the scheduler object; a jitted JAX step takes and "
                 "returns it as a value")
_IN_PLACE = ("the torch trainer's objects are built by ref_torch._steps and a checkpoint is restored into them in "
             "place; JAX builds its state as one value, fresh or restored (build, initial_state)")
_FSDP_TENSORS = "torch gathers whole tensors from FSDP shards and copies them back into the shards in place"
_TABLES = ("a jitted JAX step reads the lr from a table of the schedule's values, which the host refills as "
           "reduce_on_plateau moves; torch's scheduler sets each group's lr itself")
_JAX_BUILT = ("JAX builds its state as one value, fresh or from a checkpoint, placed on the mesh; torch restores "
              "into objects built fresh (restore)")
_MESH = "one jax.sharding Mesh over the run's devices; a torch process has one device (ref_torch._runtime)"
# (module, name) -> why the definition exists on that side only.
FRAMEWORK_ONLY: dict[tuple[str, str], str] = {
    ("ref_jax._clip_transforms", "leaf_norm"): _NORMS,
    ("ref_jax._clip_transforms", "tree_total_norm"): _NORMS,
    ("ref_jax._clip_transforms", "clip_by_global_norm_torch"): _OPTAX_CHAIN,
    ("ref_jax._clip_transforms", "clip_by_leaf_norm"): _OPTAX_CHAIN,
    ("ref_jax._clip_transforms", "clip_transform"): _OPTAX_CHAIN,
    ("ref_torch._update", "apply_update"): "torch runs the update eagerly and in place; JAX splits it into a jitted "
                                           "pure step (make_update_step) and the host's finish_update",
    ("ref_jax._update", "UpdateState"): "torch's parameters, optimizer and loss scale are objects updated in place; "
                                        "a pure JAX step takes and returns them as one value",
    ("ref_jax._update", "DeviceInfo"): "a jitted step cannot read values on the host or raise: its results stay on "
                                       "the device until finish_update",
    ("ref_jax._update", "Hyperparams"): "optax hyper-parameters are arrays passed into the jitted step; torch sets "
                                        "them on the optimizer's param_groups",
    ("ref_jax._update", "make_update_step"): "the jitted half of JAX's update (torch: apply_update)",
    ("ref_torch._model", "Tensors"): _MODULE_HOLDS,
    ("ref_torch._model", "named"): _MODULE_HOLDS,
    ("ref_torch._model", "to_device"): "torch moves each batch to the device itself; ref_jax._window lays out and "
                                       "places a whole window on the mesh",
    ("ref_torch._model", "user_loss"): _EAGER_LOSS,
    ("ref_torch._model", "batch_loss"): _EAGER_LOSS,
    ("ref_torch._model", "BatchLoss"): _EAGER_LOSS,
    ("ref_torch._model", "batch_loss_fn"): _EAGER_LOSS,
    ("ref_jax._model", "Model"): "a JAX model is a pure function of its arrays, which the state carries; a torch "
                                 "module holds its tensors",
    ("ref_jax._model", "path_name"): "pytree paths made neutral names; torch's module names already are",
    ("ref_jax._model", "to_tensors"): _KEYS,
    ("ref_jax._model", "expected"): _KEYS,
    ("ref_jax._model", "from_tensors"): _KEYS,
    ("ref_torch._parallel", "barrier"): "torch ranks wait for each other explicitly; JAX processes meet only in "
                                         "gather_bytes",
    ("ref_torch._parallel", "wrap"): "DDP and FSDP wrap a torch module; JAX places arrays on the mesh (Placement)",
    ("ref_torch._parallel", "sum_over_ranks"): "torch all-reduces counts and evaluation sums itself; JAX's are summed "
                                               "by XLA over the mesh, or over gather_bytes",
    ("ref_torch._parallel", "World"): "torch's update reduces over ranks through it (DDP's no_sync, FSDP's shards); "
                                      "a JAX update sees global arrays",
    ("ref_torch._parallel", "gather_rng"): "every rank's torch generators in one gather; JAX passes gather_bytes to "
                                           "conformance.checkpoint.rng.gather_rng",
    ("ref_torch._parallel", "finally_teardown"): "a torch process group torn down under a peer's pending gloo work "
                                                 "can abort that process, so ranks first meet at a barrier",
    ("ref_torch._parallel", "agree"): "a MIN all-reduce over torch's process group; the JAX trainer agrees over "
                                      "gather_bytes",
    ("ref_jax._parallel", "Placement"): _MESH,
    ("ref_jax._parallel", "select_devices"): _MESH,
    ("ref_jax._parallel", "placement"): _MESH,
    ("ref_jax._parallel", "host_array"): "a jax.Array spanning processes is read through its local copy; a torch "
                                         "tensor is local",
    ("ref_torch._muon", "FloatMuon"): "torch.optim.Muon hard-codes bfloat16, so torch needs a subclass for ns_dtype; "
                                      "JAX's Muon update (ref_jax._matrix) passes ns_dtype to newton_schulz",
    ("ref_torch._muon", "MuonWithFallback"): "torch.optim steps one Optimizer object over all groups; JAX's "
                                             "assembly updates each group with its own optimizer (the fallback's "
                                             "groups with the fallback's)",
    ("ref_torch._schedule_free", "ScheduleFree"): _SF_CLASSES,
    ("ref_torch._schedule_free", "ScheduleFreeAdamW"): _SF_CLASSES,
    ("ref_torch._schedule_free", "ScheduleFreeSGD"): _SF_CLASSES,
    ("ref_jax._schedule_free", "ScheduleFreeState"): _SF_LEAF,
    ("ref_jax._schedule_free", "adamw_init"): _SF_LEAF,
    ("ref_jax._schedule_free", "sgd_init"): _SF_LEAF,
    ("ref_jax._schedule_free", "eval_point"): _SF_POINTS,
    ("ref_jax._schedule_free", "train_point"): _SF_POINTS,
    ("ref_jax._schedule_free", "update"): _SF_LEAF,
    ("ref_torch._schedules", "PerEpochLR"): "a torch scheduler steps once per call, so unit = \"epoch\" wraps it "
                                            "in one stepping the inner every updates_per_epoch calls; JAX divides "
                                            "the count (schedule_step)",
    ("ref_torch._schedules", "MetricPlateau"): "ReduceLROnPlateau stepped after every update like torch's other "
                                               "schedulers; JAX's reduce_on_plateau is plateau_step, called only "
                                               "with a metric",
    ("ref_jax._schedules", "Schedule"): _COUNT,
    ("ref_jax._schedules", "GroupSchedules"): _COUNT,
    ("ref_jax._schedules", "schedule_step"): _COUNT,
    ("ref_jax._schedules", "lr_schedule"): _COUNT,
    ("ref_jax._schedules", "PlateauState"): _PURE_PLATEAU,
    ("ref_jax._schedules", "plateau_init"): _PURE_PLATEAU,
    ("ref_jax._schedules", "plateau_step"): _PURE_PLATEAU,
    ("ref_torch._train_state", "Objects"): _IN_PLACE,
    ("ref_torch._train_state", "restore"): _IN_PLACE,
    ("ref_torch._train_state", "restore_plateau"): "into the scheduler object, in place; JAX's plateau_start returns "
                                                   "the state, fresh or restored",
    ("ref_torch._train_state", "whole"): _FSDP_TENSORS,
    ("ref_torch._train_state", "load_tensors"): _FSDP_TENSORS,
    ("ref_torch._train_state", "capture_rng"): "this rank's torch generators, its own CUDA device only; JAX captures "
                                               "its key with ref_jax.checkpoint.capture_rng",
    ("ref_jax._train_state", "Parts"): _JAX_BUILT,
    ("ref_jax._train_state", "build"): _JAX_BUILT,
    ("ref_jax._train_state", "initial_state"): _JAX_BUILT,
    ("ref_jax._train_state", "initial_ema"): _JAX_BUILT,
    ("ref_jax._train_state", "schedule_tables"): _TABLES,
    ("ref_jax._train_state", "plateau_tables"): _TABLES,
    ("ref_jax._train_state", "plateau_start"): _PURE_PLATEAU,
    ("ref_jax._train_state", "plateau_observe"): _PURE_PLATEAU,
    ("ref_jax._train_state", "at_point"): "a TrainState with a schedule-free optimizer's parameters at x or y, as a "
                                          "new value; torch's optimizer moves its parameters in place "
                                          "(ref_torch.optimizers.to_eval_point / to_train_point)",
    ("ref_jax._train_state", "model_numpy"): "a checkpoint's model tensors read from a TrainState (parameters and an "
                                             "NNX model's state, keys as key data); torch reads its module's "
                                             "tensors (whole)",
    ("ref_jax._train_state", "row_pieces"): "each JAX process writes its rows of replicated whole arrays; torch "
                                            "ranks write their FSDP shards (ref_torch._shards.local_pieces)",
    ("ref_jax._update", "finish_update"): "the host half of JAX's update: the non-finite policy a jitted step cannot "
                                          "raise (torch: apply_update)",
}

# (pair, name or Class.method) -> why the two signatures differ.
OWN_SIGNATURES: dict[tuple[str, str], str] = {
    ("_parallel", "setup"): "torch's process group binds the rank's torch.device (NCCL or gloo); jax.distributed "
                            "takes run.device's name and picks the local GPU itself",
    ("_parallel", "gather_bytes"): "torch's all_gather needs the world size and the rank's device; JAX's "
                                   "process_allgather needs neither",
    ("_model", "make"): "torch places the module on a device when it is made; JAX's arrays are placed on the mesh "
                        "later, with the rest of the train state",
    ("_muon", "newton_schulz"): "torch takes a torch.dtype (torch.bfloat16 is torch's own iteration); JAX a dtype "
                                "name, whose \"bfloat16\" emulates torch's rounding, and an eps that may be a "
                                "traced hyper-parameter",
    ("_schedules", "build_scheduler"): "torch's scheduler sets an optimizer's groups in place and is rebuilt at "
                                       "update `start` by replaying its steps; JAX's schedules are pure functions of "
                                       "the count, which need each group's base lr only",
    ("_schedules", "plateau_neutral"): "torch reads the scheduler object and its optimizer; JAX a PlateauState",
    ("_schedules", "plateau_from_neutral"): "torch puts the state into the scheduler object and its optimizer in "
                                            "place; JAX returns a new PlateauState",
    ("_train_state", "save_checkpoint"): "torch reads its objects and the rank's device (the generators are "
                                         "gathered there); JAX takes the TrainState, its key, the mesh placement, "
                                         "the plateau and EMA states as values",
    ("_train_state", "params_numpy"): "torch reads its objects' tensors (collective where FSDP shards them); JAX a "
                                      "TrainState",
    ("_clip_transforms", "scale_by_norm"): "torch scales a list of tensors in place with one foreach kernel; "
                                           "JAX returns one new array, mapped over a pytree by optax transforms",
    ("_clip_transforms", "clip_with_norm"): "torch clips in place and reduces the norms of FSDP shards over ranks "
                                            "(reduce_norm); JAX returns new arrays, whose norms XLA reduces",
}


def _private_modules(pkg: ModuleType) -> set[str]:
    return {m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("_")}


PAIRS = sorted(_private_modules(ref_torch) & _private_modules(ref_jax))


def definitions(module: ModuleType) -> list[str]:
    """The public names the module's own source defines at the top level, in source order."""
    names: list[str] = []
    for node in ast.parse(Path(module.__file__).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = [node.name]
        elif isinstance(node, ast.Assign):
            found = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = [node.target.id]
        else:
            found = []
        names += [n for n in found if not n.startswith("_") and n not in names]
    return names


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "class"
    return "function" if inspect.isfunction(obj) else "value"


def private_differences(a: ModuleType, b: ModuleType, only_a: frozenset[str] = frozenset(),
                        only_b: frozenset[str] = frozenset(), own_signatures: frozenset[str] = frozenset()
                        ) -> list[str]:
    """Every way two private twin modules differ (empty: they are twins). `only_a` / `only_b`: names
    allowed on one side only; `own_signatures`: names (or Class.method) whose signatures may differ."""
    out = []
    if _doc(a) != _doc(b):
        out.append("module docstrings differ")
    names_a = [n for n in definitions(a) if n not in only_a]
    names_b = [n for n in definitions(b) if n not in only_b]
    if names_a != names_b:
        one_side = sorted(set(names_a) ^ set(names_b))
        out.append(f"definitions differ: {one_side} on one side only" if one_side
                   else f"definitions in another order: {names_a} vs {names_b}")
    for name in [n for n in names_a if n in set(names_b)]:
        x, y = getattr(a, name), getattr(b, name)
        if _kind(x) != _kind(y):
            out.append(f"{name}: different kinds ({_kind(x)} vs {_kind(y)})")
            continue
        if _kind(x) == "class":
            found = _compare_classes(name, x, y)
        elif _kind(x) == "function":
            found = _compare_functions(name, x, y)
        else:
            found = []
        out += [f for f in found if not (f.split(":")[0] in own_signatures and "signatures differ" in f)]
    return out


def _allowed(pair: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    only_t = frozenset(n for (m, n) in FRAMEWORK_ONLY if m == f"ref_torch.{pair}")
    only_j = frozenset(n for (m, n) in FRAMEWORK_ONLY if m == f"ref_jax.{pair}")
    return only_t, only_j, frozenset(n for (p, n) in OWN_SIGNATURES if p == pair)


def _pair(pair: str) -> tuple[ModuleType, ModuleType]:
    return importlib.import_module(f"ref_torch.{pair}"), importlib.import_module(f"ref_jax.{pair}")


def _not_aligned() -> dict[str, str]:
    return dict(NOT_YET_ALIGNED)


@pytest.mark.parametrize("pair", [p for p in PAIRS if p not in _not_aligned()])
def test_private_modules_are_twins(pair: str) -> None:
    assert private_differences(*_pair(pair), *_allowed(pair)) == []


def test_not_yet_aligned_only_shrinks() -> None:
    listed = [name for name, _ in NOT_YET_ALIGNED]
    assert len(listed) == len(set(listed))
    assert set(listed) <= WAS_NOT_ALIGNED, "a pair may leave NOT_YET_ALIGNED, never join it"
    assert set(listed) <= set(PAIRS), "NOT_YET_ALIGNED names a module that is no longer a pair"
    assert all(reason.strip() for _, reason in NOT_YET_ALIGNED)
    now_twins = [p for p in listed if not private_differences(*_pair(p), *_allowed(p))]
    assert now_twins == [], "these pairs are twins now: take them out of NOT_YET_ALIGNED"


def test_every_pair_is_known() -> None:
    assert set(PAIRS) == WAS_NOT_ALIGNED  # a new private pair is compared from the start


def test_the_allow_lists_name_real_one_sided_definitions() -> None:
    stale = []
    for (module, name), reason in FRAMEWORK_ONLY.items():
        side, pair = module.split(".")
        other = "ref_jax" if side == "ref_torch" else "ref_torch"
        mine = definitions(importlib.import_module(module))
        if not reason.strip() or name not in mine or name in definitions(importlib.import_module(f"{other}.{pair}")):
            stale.append(f"{module}.{name}")
    for (pair, name), reason in OWN_SIGNATURES.items():
        t, j = _pair(pair)
        top = name.split(".")[0]
        if not reason.strip() or top not in definitions(t) or top not in definitions(j):
            stale.append(f"{pair}:{name}")
    assert stale == []


# ---------------------------------------------------------------------------------------------
# negative control: a synthetic pair of private modules that differ in one aspect at a time
# ---------------------------------------------------------------------------------------------

BASE = '''
"""A fake private module."""

from typing import Any, NamedTuple

LIMIT = 3


class Out(NamedTuple):
    """Two numbers."""

    loss: Any
    count: Any = None


def run(x: int, y: int = 0) -> int:
    """Run it."""
    return _helper(x) + y


def finish(x: int) -> int:
    """Finish it."""
    return x


def _helper(x: int) -> int:
    return x
'''

MUTANTS = {
    "renamed function": ("def run(x: int, y: int = 0)", "def run_all(x: int, y: int = 0)"),
    "order": ('def run(x: int, y: int = 0) -> int:\n    """Run it."""\n    return _helper(x) + y\n',
              'def _later() -> None:\n    pass\n'),
    "module docstring": ('"""A fake private module."""', '"""Another module."""'),
    "function docstring": ('"""Finish it."""', '"""Finish it twice."""'),
    "signature": ("def finish(x: int)", "def finish(x: int, y: int = 1)"),
    "NamedTuple fields": ("    count: Any = None", "    total: Any = None"),
    "kind": ("LIMIT = 3\n", "def LIMIT() -> int:\n    return 3\n"),
    "a definition more": ("LIMIT = 3\n", "LIMIT = 3\nEXTRA = 4\n"),
}


def _fake(tmp_path: Path, name: str, source: str) -> ModuleType:
    path = tmp_path / name / "_fake.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(f"private_twins_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuple looks its module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_negative_control_each_difference_is_flagged(tmp_path: Path) -> None:
    base = _fake(tmp_path, "base", BASE)
    assert private_differences(base, _fake(tmp_path, "same", BASE)) == []
    missed = []
    for aspect, (old, new) in MUTANTS.items():
        assert old in BASE, aspect
        source = BASE.replace(old, new)
        if aspect == "order":  # run moved after finish
            source += '\n\ndef run(x: int, y: int = 0) -> int:\n    """Run it."""\n    return _helper(x) + y\n'
        mutant = _fake(tmp_path, aspect.replace(" ", "_"), source)
        if not private_differences(base, mutant) or not private_differences(mutant, base):
            missed.append(aspect)
    assert missed == []
    renamed = private_differences(base, _fake(tmp_path, "renamed", BASE.replace("def run(", "def run_all(")))
    assert renamed == ["definitions differ: ['run', 'run_all'] on one side only"]


def test_negative_control_the_allow_lists_excuse_only_what_they_name(tmp_path: Path) -> None:
    base = _fake(tmp_path, "base", BASE)
    extra = _fake(tmp_path, "extra", BASE.replace("LIMIT = 3\n", "LIMIT = 3\nEXTRA = 4\n"))
    assert private_differences(base, extra, only_b=frozenset({"EXTRA"})) == []
    assert private_differences(base, extra, only_a=frozenset({"EXTRA"})) != []
    wider = _fake(tmp_path, "wider", BASE.replace("def finish(x: int)", "def finish(x: int, y: int = 1)"))
    assert private_differences(base, wider, own_signatures=frozenset({"finish"})) == []
    assert private_differences(base, wider, own_signatures=frozenset({"run"})) != []
    # a helper (leading underscore) is each side's own business
    assert private_differences(base, _fake(tmp_path, "helper", BASE.replace("_helper", "_other"))) == []
