"""The allow-lists of tests/test_private_twins.py: the private twin definitions that exist on one
side only, the shared ones whose signatures differ, and the pairs not aligned yet, each with its
reason."""

from __future__ import annotations

# Pairs that are not twins yet, with why; only ever shrinks (see WAS_NOT_ALIGNED).
NOT_YET_ALIGNED: tuple[tuple[str, str], ...] = ()

# Every pair that was in NOT_YET_ALIGNED when this file was written: the list may lose entries only.
WAS_NOT_ALIGNED = frozenset({
    "_ademamix", "_assembly", "_clip_transforms", "_elementwise", "_model", "_muon", "_parallel", "_schedule_free",
    "_schedules", "_steps", "_train_state", "_update", "_prodigy",
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
_AD_CLASS = ("a torch optimizer is a torch.optim.Optimizer class over ref_torch._elementwise.Foreach; JAX's is an "
             "init / update pair of per-parameter pure functions (OPTIMIZERS on both sides)")
_AD_LEAF = ("one parameter's pure init / update and its state, dispatched to by ref_jax._elementwise; torch's "
            "optimizer class keeps a state dict per parameter and updates in place")
_PR_CLASS = ("a torch optimizer is a torch.optim.Optimizer class whose step() reads every parameter before moving any; "
             "JAX's is a per-parameter init and one pure update of the whole tree that ref_jax._assembly hands a "
             "Prodigy plan to")
_PR_TREE = ("one parameter's fresh state and the pure update of the whole tree (one d for every parameter); torch's "
            "optimizer class keeps a state dict per parameter and updates in place")
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
_TORCH_OPTIM = ("torch's optimizer is a torch.optim object chosen per group's options, with torch's own state keys; "
                "JAX's is one optax transform whose state (OptimizerState) holds neutral names")
_JAX_STATE = ("an optax state is a value the JAX optimizer builds, updates and replaces (jittable); a torch.optim "
              "object keeps its state and param_groups and updates them in place")
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
    ("ref_torch._ademamix", "AdEMAMix"): _AD_CLASS,
    ("ref_jax._ademamix", "AdEMAMixState"): _AD_LEAF,
    ("ref_jax._ademamix", "init"): _AD_LEAF,
    ("ref_jax._ademamix", "update"): _AD_LEAF,
    ("ref_torch._prodigy", "Prodigy"): _PR_CLASS,
    ("ref_jax._prodigy", "ProdigyState"): _PR_TREE,
    ("ref_jax._prodigy", "init"): _PR_TREE,
    ("ref_jax._prodigy", "apply"): _PR_TREE,
    ("ref_torch._prodigy", "OPTIMIZERS"): _PR_CLASS,
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
    ("ref_torch._schedules", "HyperSchedules"): "torch has no scheduler for other hyper-parameters: stand-in "
                                                "optimizers carry their values, written into the groups; JAX "
                                                "injects them into the jitted step from tables",
    ("ref_torch._schedules", "hyper_values"): "torch steps a stand-in scheduler to read a hyper-parameter's values; "
                                              "JAX evaluates build_hyper's pure schedules at the counts",
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

FRAMEWORK_ONLY.update({
    ("ref_torch._assembly", "STATE_NAMES"): _TORCH_OPTIM,
    ("ref_torch._assembly", "neutral_names"): _TORCH_OPTIM,
    ("ref_torch._assembly", "NADAM_SCHEDULE_OFF"): "torch.optim.NAdam has no switch for its momentum schedule; JAX's "
                                                   "nadam_update reads momentum_schedule",
    ("ref_torch._assembly", "FUSED"): "torch.optim's fused kernels exist for some classes; XLA fuses every update",
    ("ref_torch._assembly", "optimizer_class"): _TORCH_OPTIM,
    ("ref_torch._assembly", "kernel_options"): "torch.optim's foreach / fused flags; XLA compiles the JAX update",
    ("ref_torch._assembly", "make_single"): "one torch.optim object per optimizer kind (muon with its fallback are "
                                            "two); JAX's one transform updates every group with its own kind",
    ("ref_torch._assembly", "fresh_adagrad"): "torch.optim.Adagrad fills every accumulator from the constructor's "
                                              "value; JAX's adagrad_init reads the group's own",
    ("ref_jax._assembly", "Plan"): "a jitted optax state needs its layout as a static pytree node; torch's "
                                   "param_groups hold it",
    ("ref_jax._assembly", "OptimizerState"): _JAX_STATE,
    ("ref_jax._assembly", "fresh_state"): _JAX_STATE,
    ("ref_jax._assembly", "apply"): _JAX_STATE,
    ("ref_jax._assembly", "SWITCHES"): "a static flag of JAX's plan (no work, no buffer while off); torch.optim "
                                       "reads momentum and weight_decay at each step",
    ("ref_jax._assembly", "set_hyperparams"): _JAX_STATE,
})

_OPTIM_CLASSES = ("twinstep's own torch.optim.Optimizer classes (foreach kernels over a group), for what torch.optim "
                  "lacks; JAX writes every optimizer as per-leaf init / update functions (LEAVES)")
_LEAF_FUNCTIONS = ("one parameter's pure init / update and its NamedTuple state with the neutral names; torch's "
                   "optimizer classes keep a state dict per parameter, in torch's names, and update in place")
FRAMEWORK_ONLY.update({("ref_torch._elementwise", n): _OPTIM_CLASSES for n in (
    "Tensors", "Foreach", "DecoupledDecay", "DecoupledSGD", "DecoupledRMSprop", "DecoupledAdagrad",
    "DecoupledAdamax", "Lion", "AdamVariants", "RMSpropEpsInSqrt", "AdagradEpsInSqrt", "AdamaxEpsHat", "NAdamEpsHat")})
FRAMEWORK_ONLY[("ref_torch._elementwise", "closure_loss")] = ("torch.optim's step(closure) protocol; an optax update "
                                                              "takes gradients only")
FRAMEWORK_ONLY.update({("ref_jax._elementwise", n): _LEAF_FUNCTIONS for n in (
    "Delta", "SGDState", "AdamState", "RMSpropState", "AdagradState", "AdamaxState", "NAdamState", "LionState",
    "INTERNAL_FIELDS", "Init", "Update", "LEAVES", "init", "update",
    *(f"{o}_{f}" for o in ("sgd", "adam", "rmsprop", "adagrad", "adamax", "nadam", "radam", "lion")
      for f in ("init", "update")))})

# (pair, name or Class.method) -> why the two signatures differ.
OWN_SIGNATURES: dict[tuple[str, str], str] = {
    ("_assembly", "cautious_weight_decay"): "torch wraps an optimizer's step (hooks before and after it, in place); "
                                            "JAX computes one parameter's update and state",
    ("_assembly", "group_options"): "torch's are the constructor's keyword arguments; JAX's a (dynamic, static) "
                                    "pair of dicts",
    ("_assembly", "make"): "torch builds one object and chooses its kernels (impl); JAX returns the optax transform "
                           "and its static Plan",
    ("_parallel", "setup"): "torch's process group binds the rank's torch.device (NCCL or gloo); jax.distributed "
                            "takes run.device's name and picks the local GPU itself",
    ("_parallel", "gather_bytes"): "torch's all_gather needs the world size and the rank's device; JAX's "
                                   "process_allgather needs neither",
    ("_model", "make"): "torch places the module on a device when it is made; JAX's arrays are placed on the mesh "
                        "later, with the rest of the train state",
    ("_model", "load_pretrained"): "torch copies the weights into the module's parameters in place; JAX returns "
                                   "new arrays for its parameter dict",
    ("_muon", "newton_schulz"): "torch takes a torch.dtype (torch.bfloat16 is torch's own iteration); JAX a dtype "
                                "name, whose \"bfloat16\" emulates torch's rounding, and an eps that may be a "
                                "traced hyper-parameter",
    ("_schedules", "build_scheduler"): "torch's scheduler sets an optimizer's groups in place and is rebuilt at "
                                       "update `start` by replaying its steps; JAX's schedules are pure functions of "
                                       "the count, which need each group's base lr only",
    ("_schedules", "build_hyper"): "torch wraps the lr's scheduler and writes into the optimizer's groups, rebuilt "
                                   "at an update; JAX returns pure schedules of the count from the groups' values",
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
