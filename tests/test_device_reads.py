"""No host waits inside an update: between a window's first forward pass and its optimizer step
nothing reads the device, and an update reads it once, after its step, for the metrics line
(ref_torch._update.apply_update). Counted on the CPU with the kernels CUDA gets (fused AdamW):

- a TorchFunctionMode sees every Python-level read of a tensor (`.item()`, `.tolist()`, `float()`,
  `bool()`, `.numpy()`, `.cpu()`, ...), which on CUDA copy to the host and wait for the device;
- a TorchDispatchMode sees the reads below Python (`aten._local_scalar_dense`, data-dependent shapes
  such as `nonzero`) and marks the optimizer step (the fused kernel's own op).

The first update reads before its step (the step makes the optimizer's state: a held first step
would make it too, see _holds_on_device); every later one reads only after it. The held path is
bit for bit the host-decided one, skips included. Negative controls: a planted `.item()` and a
planted `bool(tensor)` inside the loss are both caught.

torch.compile: the built-in gpt compiles to one graph with no break (torch._dynamo.explain), in
training mode with and without dropout; control: a forward pass with a host read breaks.

JAX (ref_jax._steps): the jitted update reads nothing, and the host fetches its metrics once per
update in one jax.device_get, after the next window is laid out (a skipped update included: the
policy's count comes with the metrics); every other fetch of an array's value is counted through
ArrayImpl._value. Control: a read of the step's loss before the fetch is caught.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.run.metrics import read_metrics, updates
from ref_torch import _assembly, _model, _steps
from ref_torch import _update as tupd
from ref_torch.models import GPT
from ref_torch.trainer import train

READ_METHODS = {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__complex__"}
READ_OPS = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "unique", "masked_select"}
STEP_OPS = {"_fused_adamw_", "_fused_adam_", "_fused_sgd_", "_fused_adagrad_"}

TINY = {"model": {"name": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.0},
       "data": {"name": "text", "batch_size": 4, "stride": 32},
       "loss": {"name": "cross_entropy"},
       "optimizer": {"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1},
       "schedule": {"name": "warmup_cosine", "warmup_steps": 2, "total_steps": 6, "eta_min": 3e-4},
       "clip": {"max_norm": 1.0}, "accumulation": {"steps": 4, "normalize": "tokens"},
       "checkpoint": {"every": 0, "at_end": False}, "run": {"max_updates": 6, "eval_every": 0, "seed": 3}}
PRECISIONS = {
    "float32": {},
    "bfloat16": {"dtype": "bfloat16"},
    # dynamic scaling, and an overflow at update 3: a step the device holds
    "float16-dynamic": {"dtype": "float16", "loss_scale": "dynamic", "init_scale": 256.0},
}


class Reads:
    """The events of one run in order: ("update", t), ("read", where), ("step", op)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.inside_read = 0  # a Python-level read is being served: its aten read is the same read

    def read(self, name: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-3] if "/torch/" not in f.filename]
        self.events.append(("read", f"{name} at {Path(frames[-1].filename).name}:{frames[-1].lineno}"))

    def per_update(self) -> list[list[tuple[str, Any]]]:
        out: list[list[tuple[str, Any]]] = []
        for kind, what in self.events:
            if kind == "update":
                out.append([])
            elif out:
                out[-1].append((kind, what))
        return out


class _Functions(TorchFunctionMode):
    def __init__(self, reads: Reads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name not in READ_METHODS:
            return func(*args, **(kwargs or {}))
        self.reads.read(name)
        self.reads.inside_read += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.reads.inside_read -= 1


class _Ops(TorchDispatchMode):
    def __init__(self, reads: Reads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.__name__.split(".")[0]
        if name in STEP_OPS:
            self.reads.events.append(("step", name))
        elif name in READ_OPS and not self.reads.inside_read:
            self.reads.read(f"aten.{name}")
        return func(*args, **(kwargs or {}))


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Count the reads of every Steps.update call (not the run's set-up or its end)."""
    reads = Reads()
    update = _steps.Steps.update

    def counted(self: Any, t: int) -> Any:
        reads.events.append(("update", t))
        with _Ops(reads), _Functions(reads):
            return update(self, t)

    monkeypatch.setattr(_steps.Steps, "update", counted)
    yield reads


def cuda_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimizer kernels run.device = "cuda" gets ("auto": fused), on the CPU."""
    options = _assembly.kernel_options
    monkeypatch.setattr(_assembly, "kernel_options", lambda name, cls, params, impl: options(name, cls, params, "fused"))


def config(precision: str) -> dict[str, Any]:
    out = {k: dict(v) for k, v in TINY.items()}
    out["precision"] = dict(PRECISIONS[precision])
    if precision == "float16-dynamic":
        out["run"]["inject_nonfinite"] = [3]
    return out


def violations(per_update: list[list[tuple[str, Any]]]) -> list[str]:
    """What breaks the discipline: more than one read in an update, or (after the first update) a
    read before the optimizer step."""
    found = []
    for t, events in enumerate(per_update):
        reads = [what for kind, what in events if kind == "read"]
        steps = [i for i, (kind, _) in enumerate(events) if kind == "step"]
        if len(reads) > 1:
            found.append(f"update {t}: {len(reads)} reads: {reads}")
        if t > 0 and steps and any(kind == "read" for kind, _ in events[:steps[0]]):
            found.append(f"update {t}: a read before the optimizer step: {events[:steps[0]]}")
        if t > 0 and not steps:
            found.append(f"update {t}: no fused optimizer step seen")
    return found


def counted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> list[list[tuple[str, Any]]]:
    cuda_kernels(monkeypatch)
    with counting(monkeypatch) as reads:
        train(config(precision), tmp_path / "run", progress="none")
    return reads.per_update()


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_one_read_per_update_after_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    per_update = counted_run(tmp_path, monkeypatch, precision)
    assert len(per_update) == TINY["run"]["max_updates"]
    assert violations(per_update) == []
    for t, events in enumerate(per_update):
        assert [kind for kind, _ in events].count("read") == 1, (t, events)
    skipped = [r["skipped"] for r in updates(read_metrics(tmp_path / "run" / "metrics.jsonl"))]
    assert skipped == [precision == "float16-dynamic" and t == 3 for t in range(6)]


@pytest.mark.parametrize("plant", ["item", "bool"])
def test_negative_control_a_read_inside_the_window_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              plant: str) -> None:
    make = _model.batch_loss_fn

    def planted(*args: Any, **kwargs: Any) -> Any:
        inner = make(*args, **kwargs)

        def batch_loss(batch: Any) -> Any:
            out = inner(batch)
            _ = out[0].sum.item() if plant == "item" else bool(out[0].sum > 0)  # what a careless loop does
            return out

        return batch_loss

    monkeypatch.setattr(_model, "batch_loss_fn", planted)
    found = violations(counted_run(tmp_path, monkeypatch, "float32"))
    assert any("a read before the optimizer step" in v for v in found)
    assert any("5 reads" in v for v in found)  # 4 micro-batches + the update's own read


def final_state(tmp_path: Path, name: str, precision: str) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    result = train(config(precision), tmp_path / name, progress="none")
    lines = [{k: r[k] for k in ("loss", "grad_norm", "skipped", "loss_scale", "lr")}
             for r in updates(read_metrics(tmp_path / name / "metrics.jsonl"))]
    return lines, result.params


@pytest.mark.parametrize("precision", ["float32", "float16-dynamic"])
def test_the_held_step_is_the_host_decided_step_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            precision: str) -> None:
    cuda_kernels(monkeypatch)
    held_lines, held = final_state(tmp_path, "held", precision)
    monkeypatch.setattr(tupd, "_holds_on_device", lambda optimizer: False)  # every step decided on the host
    host_lines, host = final_state(tmp_path, "host", precision)
    assert held_lines == host_lines
    assert held.keys() == host.keys()
    for name in held:
        np.testing.assert_array_equal(held[name], host[name], err_msg=name)


class _Careless(GPT):
    """The built-in gpt with a host read in its forward pass (the negative control)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = super().forward(idx)
        return logits * 2.0 if logits.abs().max().item() > 1e30 else logits


@pytest.mark.parametrize("cls", [GPT, _Careless])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_builtin_gpt_compiles_without_graph_breaks(cls: type, dropout: float) -> None:
    torch._dynamo.reset()
    model = cls(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=dropout).train()
    idx = torch.randint(0, 65, (2, 32), generator=torch.Generator().manual_seed(0))
    explained = torch._dynamo.explain(model)(idx)
    # a break at the end of the forward pass (the control's) is a break reason but not a counted break
    broken = explained.graph_break_count + len(explained.break_reasons)
    if cls is GPT:
        assert broken == 0 and explained.graph_count == 1, explained.break_reasons
    else:
        assert broken >= 1


# ---------------------------------------------------------------------------------------------
# JAX: the jitted update reads nothing; the host fetches its metrics once, in one device_get
# ---------------------------------------------------------------------------------------------


@contextmanager
def counting_jax(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Per JAX Steps.update: ("read", "device_get") for each jax.device_get, ("read", where) for
    every other fetch of an array's value (float(x), np.asarray(x), x.item(), ...: ArrayImpl._value)."""
    import jax
    from jax._src.array import ArrayImpl

    from ref_jax import _steps as jsteps

    reads, inside, active = Reads(), [0], [False]
    value, device_get, update = ArrayImpl._value, jax.device_get, jsteps.Steps.update

    def counted_get(x: Any) -> Any:
        if active[0]:
            reads.events.append(("read", "device_get"))
        inside[0] += 1
        try:
            return device_get(x)
        finally:
            inside[0] -= 1

    def counted_value(self: Any) -> Any:
        if active[0] and not inside[0]:
            reads.read("ArrayImpl._value")
        return value.fget(self)

    def counted_update(self: Any, t: int) -> Any:
        reads.events.append(("update", t))
        active[0] = True
        try:
            return update(self, t)
        finally:
            active[0] = False

    monkeypatch.setattr(ArrayImpl, "_value", property(counted_value))
    monkeypatch.setattr(jax, "device_get", counted_get)
    monkeypatch.setattr(jsteps.Steps, "update", counted_update)
    yield reads


def jax_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> list[list[str]]:
    from ref_jax.trainer import train as jax_train

    with counting_jax(monkeypatch) as reads:
        jax_train(config(precision), tmp_path / "jax", progress="none")
    return [[what for kind, what in events if kind == "read"] for events in reads.per_update()]


@pytest.mark.parametrize("precision", ["float32", "float16-dynamic"])
def test_jax_update_reads_its_metrics_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    per_update = jax_reads(tmp_path, monkeypatch, precision)
    assert per_update == [["device_get"]] * TINY["run"]["max_updates"]
    skipped = [r["skipped"] for r in updates(read_metrics(tmp_path / "jax" / "metrics.jsonl"))]
    assert skipped == [precision == "float16-dynamic" and t == 3 for t in range(6)]


def test_jax_negative_control_a_read_of_the_step_output_is_caught(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from ref_jax import _steps as jsteps

    make = jsteps.make_train_step

    def planted(*args: Any, **kwargs: Any) -> Any:
        step = make(*args, **kwargs)

        def careless(*a: Any) -> Any:
            state, out = step(*a)
            float(out.info.loss)  # what a careless loop does: wait for the loss before anything else
            return state, out

        return careless

    monkeypatch.setattr(jsteps, "make_train_step", planted)
    per_update = jax_reads(tmp_path, monkeypatch, "float32")
    assert all(reads[0].startswith("ArrayImpl._value") and reads[1:] == ["device_get"] for reads in per_update)
