"""The frameworks' own built-ins as backends: torch-native, optax-native and
keras run the bundled suite, and docs/divergences.md is the executable ledger of their failures.

Each native backend runs the whole suite once per session (`native_results`, cached): every failure
must be listed by a ledger row for that backend, every listed case must still fail. Negative
controls: a planted bug in a native backend gives failures no row lists; a row that lists a passing
case, or an id the suite lacks, is reported; a ledger without the lists explains nothing. Keras's
own semantics that the ledger's Keras rows state are measured directly here too.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from conformance.cli import main
from conformance.harness.backends import NATIVES, PatchedBackend, resolve_backend
from conformance.harness.case import collect_cases
from conformance.harness.ledger import audit, parse_ledger, read_ledger
from conformance.harness.report import markdown_report
from conformance.harness.runner import Result, run_cases

ROOT = Path(__file__).resolve().parents[1]
HAS_KERAS = find_spec("keras") is not None
NATIVE = ["torch-native", "optax-native",
          pytest.param("keras", marks=pytest.mark.skipif(not HAS_KERAS, reason="keras is not installed"))]
TORCH_SOURCE = re.compile(r"\btorch 2\.\d+|from torch\.optim")


@functools.cache
def suite() -> tuple:
    cases, broken = collect_cases(None, None)
    assert not broken
    return tuple(cases)


@functools.cache
def native_results(name: str) -> tuple[Result, ...]:
    """One run of the bundled suite on a native backend per session (the tests below share it)."""
    return tuple(run_cases(suite(), [resolve_backend(name)]))


@pytest.mark.parametrize("backend", NATIVE)
def test_the_ledger_lists_every_native_failure_and_each_listed_case_still_fails(backend: str) -> None:
    results = native_results(backend)
    unexplained, stale, misstated = audit(results, read_ledger(), backend)
    messages = {r.case: r.message for r in results}
    assert not unexplained, "native failures no docs/divergences.md row lists: " + "; ".join(
        f"{c}: {messages[c]}" for c in unexplained)
    assert not stale, "docs/divergences.md lists cases that no longer fail: " + "; ".join(stale)
    assert not misstated, "docs/divergences.md says these fail otherwise: " + "; ".join(misstated)
    assert sum(r.status == "passed" for r in results) >= 60  # it really ran the suite


@pytest.mark.parametrize("backend", NATIVE)
def test_no_native_backend_crashes_on_a_bundled_case(backend: str) -> None:
    """A crash is a bug of the backend, never a divergence a ledger row may list (keras's update path
    once passed a count where its schedule wanted the iterations and crashed on every case with
    [schedule] or [clip]; K-F64 and C-EPS listed two of them)."""
    crashed = [f"{r.case}: {r.message}" for r in native_results(backend) if "crashed on case" in r.message]
    assert not crashed, "; ".join(crashed)


def test_torch_native_passes_every_torch_generated_case_it_supports() -> None:
    source = {c.id: c.source for c in suite()}
    results = [r for r in native_results("torch-native") if TORCH_SOURCE.search(source[r.case])]
    assert len(results) > 120
    bad = [f"{r.case}: {r.message}" for r in results if r.status == "failed"]
    assert not bad
    assert sum(r.status == "passed" for r in results) > 110


def test_native_backends_are_built_in_names(capsys) -> None:
    assert main(["conform", "--list-backends"]) == 0
    listed = capsys.readouterr().out
    for name, package in NATIVES.items():
        assert re.search(rf"^{name}\s+{package}\s+built-in", listed, re.M)
    assert main(["conform", "--backend", "torch-native", "--only", "loss/mse-*", "--only", "clip/value"]) == 0
    assert re.search(r"torch-native: (\d+) passed, 0 failed", capsys.readouterr().out)


def test_keras_on_another_keras_backend_is_one_line_and_exit_2() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "torch"}
    out = subprocess.run([sys.executable, "-m", "conformance", "conform", "--backend", "keras"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("twinstep: error: backend keras (natives.keras_backend) cannot be imported: ImportError: "
                          "the keras backend runs Keras on JAX; KERAS_BACKEND=torch\n")


def test_a_case_without_a_native_equivalent_is_unsupported_with_the_reason() -> None:
    got = {(r.backend, r.case): r for b in ("torch-native", "optax-native") for r in native_results(b)}
    lion = got[("torch-native", "optimizer/optax-lion-open")]
    assert lion.status == "unsupported" and "torch.optim has no such class" in lion.message
    dampening = got[("optax-native", "optimizer/torch-sgd-closed")]
    assert dampening.status == "unsupported" and "optimizer.dampening = 0.1" in dampening.message
    assert got[("optax-native", "train/linear-regression-sgd")].message == "unsupported: trainer.train"


# the peer-semantics fields on each framework's own built-in (docs/backends.md, "Native backends"): what maps passes,
# what has no argument is unsupported naming the field and the built-in
MAPPED = [
    ("torch-native", "optimizer/schedulefree-adamw-open", "passed", ""),  # schedulefree.AdamWScheduleFree
    ("torch-native", "optimizer/ema-torch-adamw-every-start", "passed", ""),  # AveragedModel(get_ema_multi_avg_fn)
    ("torch-native", "schedule/plateau-max-abs-cooldown-min-lr-groups", "passed", ""),  # ReduceLROnPlateau
    ("torch-native", "schedule/cyclic-triangular2-spots", "passed", ""),  # CyclicLR at spots
    ("torch-native", "schedule/chained-linear-cosine", "passed", ""),  # ChainedScheduler
    ("torch-native", "loss/ce-sample-weight", "passed", ""),  # reduction="none" × s
    ("torch-native", "schedule/sequential-linear-tabulated", "passed", ""),  # SequentialLR([LinearLR, LambdaLR])
    ("torch-native", "optimizer/torch-adam-eps-hat", "unsupported",
     "optimizer.eps_hat = True: torch.optim.Adam has no such argument"),
    ("torch-native", "optimizer/torch-sgd-decoupled", "unsupported",
     "optimizer.decoupled_weight_decay = True: torch.optim.SGD has no such argument"),
    ("torch-native", "schedule/optax-polynomial-end-value", "unsupported",
     "schedule.end_factor = 0.2: torch.optim.lr_scheduler.PolynomialLR has no such argument"),
    ("optax-native", "optimizer/keras-sgd-weight-decay", "passed", ""),  # chain(trace, add_decayed_weights, lr)
    ("optax-native", "loss/focal-default", "passed", ""),  # optax.losses.sigmoid_focal_loss(alpha=0.25)
    ("optax-native", "schedule/keras-restarts-test-mmul", "passed", ""),  # sgdr_schedule with m_mul peaks
    ("optax-native", "schedule/plateau-negative-metric-eps-0", "passed", ""),  # optax.contrib.reduce_on_plateau
    ("optax-native", "schedule/plateau-min-rel-negative-metric", "unsupported",
     "schedule.eps = 1e-08: optax.contrib.reduce_on_plateau (no eps: every reduction applies)"),
    ("optax-native", "optimizer/schedulefree-sgd-closed", "unsupported",
     "optimizer.r = 1.0: optax.contrib.schedule_free_sgd has no equivalent"),
    ("optax-native", "schedule/cyclic-triangular2-spots", "unsupported", "optax has no such schedule"),
    ("optax-native", "optimizer/prodigyopt-prodigy-bias-corrected", "passed", ""),  # optax.contrib.prodigy
    ("optax-native", "optimizer/prodigyopt-prodigy-groups", "unsupported",
     "prodigy with several parameter groups: optax.contrib.prodigy inside multi_transform estimates one d per group"),
    ("optax-native", "optimizer/prodigyopt-prodigy-beta1-zero", "unsupported",
     "optimizer.growth_rate = 1.02: optax.contrib.prodigy (no cap on d's growth) has no equivalent"),
    ("optax-native", "schedule/tabulated-two-groups", "unsupported", "optax has no such schedule"),
    ("keras", "optimizer/ema-keras-adam", "passed", ""),  # use_ema=True, ema_momentum
    ("keras", "optimizer/keras-adam-eps-hat", "passed", ""),  # Keras's Adam is eps_hat
    ("keras", "optimizer/keras-adamax-eps-hat", "passed", ""),
    ("keras", "optimizer/keras-nadam", "passed", ""),  # momentum_decay = 1
    ("keras", "loss/ce-sample-weight", "passed", ""),
    ("keras", "schedule/tabulated-sampled-nanogpt-lambda", "passed", ""),  # PiecewiseConstantDecay
    ("keras", "optimizer/torch-nadam-eps-hat", "unsupported", "optimizer.eps_hat = True: keras.optimizers (nadam)"),
    ("keras", "schedule/plateau-nan-is-bad", "unsupported", "keras.callbacks.ReduceLROnPlateau drives Model.fit"),
]


@pytest.mark.parametrize(("backend", "case", "status", "message"), MAPPED, ids=[f"{c}[{b}]" for b, c, *_ in MAPPED])
def test_new_spec_fields_map_onto_the_frameworks_own_built_ins(backend: str, case: str, status: str,
                                                                message: str) -> None:
    if backend == "keras" and not HAS_KERAS:
        pytest.skip("keras is not installed")
    if "schedulefree" in case and backend == "torch-native" and find_spec("schedulefree") is None:
        pytest.skip("schedulefree is not installed")
    got = next(r for r in native_results(backend) if r.case == case)
    assert (got.status, message in got.message) == (status, True), got.message


def test_the_report_shows_the_ledger_row_of_each_native_failure() -> None:
    text = markdown_report(list(native_results("optax-native")), read_ledger())
    assert re.search(r"\| `optimizer/torch-nadam-open` \| \*\*FAIL\*\* [^|]+ \| optax-native: O-NADAM, O-COUNT \|", text)
    assert "no row" not in text


# --- negative controls ---------------------------------------------------------------------------

def _bigger(fn):
    def planted(spec, *args, **kwargs):
        out = dict(fn(spec, *args, **kwargs))
        out["value"] = np.asarray(out["value"]) * 1.001  # a 0.1 % bug in the native loss
        return out
    return planted


@pytest.mark.parametrize("backend", ["torch-native", "optax-native"])
def test_negative_control_a_planted_native_bug_is_a_failure_no_row_lists(backend: str) -> None:
    native = resolve_backend(backend)
    planted = PatchedBackend(backend, native.package, patches=(
        ("losses", "loss_value_and_grad", _bigger(native.function("losses", "loss_value_and_grad"))),))
    losses = [c for c in suite() if re.match(r"loss/(mse|huber|ce)-", c.id)]
    unexplained, _, _ = audit(run_cases(losses, [planted]), read_ledger(), backend)
    assert len(unexplained) > 15 and "loss/mse-mean" in unexplained
    assert audit(run_cases(losses, [native]), read_ledger(), backend).unexplained == []  # the same, unplanted


@pytest.mark.parametrize("backend", NATIVE)
def test_negative_control_a_row_for_a_passing_or_unknown_case_is_stale(backend: str) -> None:
    text = (ROOT / "docs" / "divergences.md").read_text(encoding="utf-8")
    passed = next(r.case for r in native_results(backend) if r.status == "passed")
    fake = f"\n| X-FAKE | made up | none | **{backend} fails** `{passed}`, `loss/no-such-case`, `{passed}*` |\n"
    _, stale, _ = audit(native_results(backend), parse_ledger(text + fake), backend)
    assert stale == [f"X-FAKE: {passed} passed", "X-FAKE: loss/no-such-case absent", f"X-FAKE: {passed} passed",
                     f"X-FAKE: {passed}* matches no failure"]


@pytest.mark.parametrize("backend", NATIVE)
def test_negative_control_a_ledger_without_the_lists_explains_nothing(backend: str) -> None:
    text = re.sub(r"\*\*[a-z-]+ fails\*\*[^|]*", "", (ROOT / "docs" / "divergences.md").read_text("utf-8"))
    unexplained, stale, misstated = audit(native_results(backend), parse_ledger(text), backend)
    assert unexplained == sorted(r.case for r in native_results(backend) if r.status == "failed")
    assert unexplained and not stale and not misstated


def _listed_difference(backend: str) -> tuple[Result, str]:
    """A failure some row lists for `backend` as a numeric difference, and that row's bound."""
    rows = read_ledger()
    for r in native_results(backend):
        for row in rows:
            for how in row.stated(backend, r.case) if r.status == "failed" else ():
                if how.startswith("rel ≤") and r.max_rel_err > 0:
                    return r, how
    raise AssertionError(f"no row lists a relative difference for {backend}")


@pytest.mark.parametrize("backend", ["optax-native", "keras"])
def test_negative_control_a_crash_or_a_bigger_difference_where_a_row_states_one_is_misstated(backend: str) -> None:
    """The ledger states how each listed case fails: a crash, or a difference ten times the one
    measured (always above a bound rounded up to the next power of ten), is not what it states."""
    if backend == "keras" and not HAS_KERAS:
        pytest.skip("keras is not installed")
    listed, how = _listed_difference(backend)
    bound = float(how.split("≤")[1])
    crashed = dataclasses.replace(listed, message=f"backend {backend} crashed on case {listed.case}: TypeError: x")
    bigger = dataclasses.replace(listed, max_rel_err=bound * 10, max_abs_err=listed.max_abs_err * 10)
    others = [r for r in native_results(backend) if r.case != listed.case]
    for planted, why in ((crashed, "fails by crash"), (bigger, "is above the row's")):
        misstated = audit([*others, planted], read_ledger(), backend).misstated
        assert misstated and all(listed.case in m and why in m for m in misstated), misstated
    assert not audit([*others, listed], read_ledger(), backend).misstated  # unplanted, it holds


def test_negative_control_a_list_that_states_nothing_is_misstated() -> None:
    text = (ROOT / "docs" / "divergences.md").read_text("utf-8")
    bare = re.sub(r"(\*\*optax-native fails\*\*) \([^()]*\)", r"\1", text)
    misstated = audit(native_results("optax-native"), parse_ledger(bare), "optax-native").misstated
    failed = [r.case for r in native_results("optax-native") if r.status == "failed"]
    assert len(misstated) >= len(failed) and all("states no kind of failure" in m for m in misstated)


# --- Keras's own semantics, measured (docs/divergences.md, section "Keras 3") ---------------------

@pytest.fixture
def keras():
    if not HAS_KERAS:
        pytest.skip("keras is not installed")
    from natives.keras_backend.backend import context, load

    with context():
        yield load()


def test_keras_promotes_float64_means_to_float32(keras) -> None:
    x = np.array([0.1, 0.2, 0.7], np.float64)
    got = float(keras.ops.mean(keras.ops.convert_to_tensor(x, "float64")))
    assert got != float(np.mean(x)) and got == float(np.float32(np.mean(x.astype(np.float32))))


def test_keras_weight_decay_is_decoupled_on_every_optimizer(keras) -> None:
    p = keras.Variable(np.array([2.0]), dtype="float64")
    keras.optimizers.SGD(learning_rate=0.1, weight_decay=0.5).apply_gradients([(np.array([1.0]), p)])
    decoupled, l2 = 2.0 - 2.0 * 0.5 * 0.1 - 0.1 * 1.0, 2.0 - 0.1 * (1.0 + 0.5 * 2.0)
    assert np.asarray(p.value)[0] == pytest.approx(decoupled, abs=1e-15) and decoupled != l2


def test_keras_piecewise_boundary_is_inclusive(keras) -> None:
    s = keras.optimizers.schedules.PiecewiseConstantDecay([3], [1.0, 0.5])
    assert [float(s(t)) for t in (2, 3, 4)] == [1.0, 1.0, 0.5]  # torch's milestone 3 gives 0.5 at update 3


def test_keras_polynomial_decay_is_nan_jitted_past_its_end(keras) -> None:
    import jax
    import jax.numpy as jnp

    s = keras.optimizers.schedules.PolynomialDecay(1.0, decay_steps=10, end_learning_rate=0.0, power=0.9)
    assert [float(s(t)) for t in (10, 11)] == [0.0, 0.0]  # eagerly, as torch's PolynomialLR
    assert all(np.isnan(float(jax.jit(s)(jnp.asarray(t)))) for t in (10, 11))  # S-POLY-JIT


def test_keras_focal_gradient_is_nan_at_saturated_logits() -> None:
    """K-FOCAL-NAN, in Keras's default configuration (floatx float32, no x64): NaN from x ≈ 17."""
    if not HAS_KERAS:
        pytest.skip("keras is not installed")
    import jax
    import jax.numpy as jnp

    from natives.keras_backend.backend import load

    keras = load()
    before = keras.config.floatx()
    keras.config.set_floatx("float32")
    try:
        with jax.enable_x64(False):
            focal = keras.losses.BinaryFocalCrossentropy(apply_class_balancing=False, gamma=0.5, from_logits=True,
                                                         reduction="sum")
            x = jnp.asarray([[3.0], [16.0], [17.0], [20.0]], "float32")
            grad = np.asarray(jax.grad(lambda z: focal(jnp.ones_like(z), z))(x)).ravel()
    finally:
        keras.config.set_floatx(before)
    assert np.isfinite(grad[:2]).all() and np.isnan(grad[2:]).all()


def test_the_keras_report_in_the_docs_matches_a_fresh_run() -> None:
    if not HAS_KERAS:
        pytest.skip("keras is not installed")
    committed = (ROOT / "docs" / "keras_report.md").read_text(encoding="utf-8")
    cells = dict(re.findall(r"^\| `([^`]+)` \| (pass|\*\*FAIL\*\*|unsupported)", committed, re.M))
    fresh = {r.case: {"passed": "pass", "failed": "**FAIL**", "unsupported": "unsupported"}[r.status]
             for r in native_results("keras")}
    assert cells == fresh, "docs/keras_report.md is stale: twinstep conform --backend keras --report docs/keras_report.md"
