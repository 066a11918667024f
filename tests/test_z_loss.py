"""cross_entropy's `z_loss` (PaLM's auxiliary z·(log Z)²): the spec's refusals, the same on every
backend; z_loss = 0 changes nothing; the oracle's gradient against finite differences; the (sum,
count) reduction across micro-batches; and negative controls (a wrong expected value, peers' known
variants planted in a backend) that the z-loss cases must catch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conformance.config import load_config
from conformance.config.loss import LossSpec
from conformance.errors import ConfigError
from conformance.harness.backends import Backend, PatchedBackend, resolve_backend
from conformance.harness.case import load_case, load_cases
from conformance.harness.runner import run_case
from conformance.oracle import losses as oracle
from conformance.rules.inputs import check_loss_inputs

BACKENDS = ["torch", "jax", "oracle"]
CASES = {c.id: c for c in load_cases(only=["loss/*"])}
Z_CASES = sorted(cid for cid in CASES if cid.startswith("loss/z-loss-"))
REFUSAL = "loss.z_loss is only used when name is cross_entropy; received 0.1 with name = 'mse'"


def _module(backend: str) -> Any:
    return Backend(backend).module("losses")


def test_the_bundled_suite_has_the_z_loss_cases() -> None:
    names = {cid.removeprefix("loss/z-loss-") for cid in Z_CASES}
    assert {"plain", "ignore", "sum", "none", "mask", "sample-weight", "weight", "smooth", "probs",
            "float32"} <= names


@pytest.mark.parametrize("name", ["mse", "nll", "bce_with_logits", "kl_div", "sigmoid_focal", "huber"])
def test_z_loss_on_another_loss_is_a_one_line_config_error_naming_the_field(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"loss": {"name": name, "z_loss": 0.1}})
    text = str(info.value)
    assert text.startswith("loss.z_loss is only used when name is cross_entropy") and "\n" not in text
    load_config({"loss": {"name": name, "z_loss": 0.0}})  # the default, spelled out, is accepted


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "0.1", True])
def test_z_loss_must_be_a_finite_number_at_least_0(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"^loss\.z_loss "):
        load_config({"loss": {"z_loss": bad}})


def test_both_trainers_refuse_the_same_config_with_the_same_error(tmp_path: Path) -> None:
    from ref_jax.trainer import train as jax_train
    from ref_torch.trainer import train as torch_train

    config = {"loss": {"name": "mse", "z_loss": 0.1}}
    messages = []
    for i, train in enumerate((torch_train, jax_train)):
        with pytest.raises(ConfigError) as info:
            train(config, tmp_path / str(i))
        messages.append(str(info.value))
        assert not (tmp_path / str(i)).exists()  # refused before anything is written
    assert messages == [REFUSAL, REFUSAL]


def test_the_cli_refusal_is_one_line_on_both_backends(tmp_path: Path) -> None:
    lines = []
    for backend in ("torch", "jax"):
        run = subprocess.run([sys.executable, "-m", "conformance", "train", "--backend", backend, "--out",
                              str(tmp_path / backend), "--set", "loss.name=\"mse\"", "--set", "loss.z_loss=0.1"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 2
        lines.append(run.stderr.strip())
    assert lines[0] == lines[1] and lines[0].endswith(REFUSAL) and "\n" not in lines[0]


@pytest.mark.parametrize("native", ["torch-native", "optax-native"])
def test_native_backends_report_z_loss_unsupported_naming_the_field(native: str) -> None:
    result = run_case(CASES["loss/z-loss-plain"], resolve_backend(native))
    assert result.status == "unsupported"
    assert "loss.z_loss = 0.0001" in result.message and "has no equivalent" in result.message


def _ce_cases() -> list[str]:
    return sorted(cid for cid, c in CASES.items() if not c.expects_error and c.sections["loss"].name == "cross_entropy"
                  and not cid.startswith("loss/z-loss-"))


def _call(module: Any, case: Any, spec: LossSpec) -> dict[str, Any]:
    i = case.inputs
    opt = {k: (None if getattr(i, k, None) is None else np.asarray(getattr(i, k)))
           for k in ("weight", "mask", "sample_weight")}
    return module.loss_value_and_grad(spec, np.asarray(i.prediction, np.float64), np.asarray(i.target),
                                      dtype=case.dtype, **opt)


@pytest.mark.parametrize("backend", BACKENDS)
def test_z_loss_0_leaves_every_cross_entropy_result_bit_identical(backend: str) -> None:
    module, compared = _module(backend), 0
    with Backend(backend).context():
        for cid in _ce_cases():
            compared += _same_without_z(module, CASES[cid])
    assert compared == len(_ce_cases()) >= 30


def _same_without_z(module: Any, case: Any) -> int:
    """1 when the case's result with z_loss = 0 spelled out equals the default's bit for bit."""
    spec = case.sections["loss"]
    assert spec.z_loss == 0.0
    off = LossSpec.model_validate({**spec.model_dump(exclude_unset=True), "z_loss": 0.0})
    want = _call(module, case, spec)
    got = _call(module, case, off)
    for key in ("value", "grad", "sum", "count"):
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=f"{case.id} {key}")
    return 1


def _fd_inputs() -> list[tuple[str, LossSpec, np.ndarray, np.ndarray, dict[str, Any]]]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(5, 4)) * 2 + 1
    y = np.array([0, -100, 3, 2, 1])
    q = rng.dirichlet(np.ones(4), 5)
    x3, y3 = rng.normal(size=(2, 4, 3)), np.array([[0, 1, -100], [3, 3, 2]])
    w = [1.0, 2.0, 0.5, 0.0]
    return [
        ("mean-ignore", LossSpec(z_loss=0.3), x, y, {}),
        ("sum", LossSpec(z_loss=0.3, reduction="sum"), x, y, {}),
        ("none", LossSpec(z_loss=0.3, reduction="none"), x, y, {}),
        ("weight-smooth", LossSpec(z_loss=0.3, weight=w, label_smoothing=0.2), x, y, {}),
        ("mask-sample-weight", LossSpec(z_loss=0.3), x, y,
         {"mask": np.array([1, 1, 0, 1, 1], bool), "sample_weight": rng.uniform(0.5, 2, 5)}),
        ("probs", LossSpec(z_loss=0.3, weight=w), x, q, {}),
        ("3d", LossSpec(z_loss=0.3), x3, y3, {}),
        ("unbatched", LossSpec(z_loss=0.3), x[0], np.array(2), {}),
    ]


@pytest.mark.parametrize("label, spec, x, y, extra", _fd_inputs(), ids=[t[0] for t in _fd_inputs()])
def test_oracle_gradient_matches_central_differences(label: str, spec: LossSpec, x: np.ndarray, y: np.ndarray,
                                                     extra: dict[str, Any]) -> None:
    out = oracle.loss_value_and_grad(spec, x, y, **extra)
    h = 1e-6
    fd = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        fd[idx] = (oracle.loss_value_and_grad(spec, up, y, **extra)["value"].sum()
                   - oracle.loss_value_and_grad(spec, down, y, **extra)["value"].sum()) / (2 * h)
    np.testing.assert_allclose(out["grad"], fd, rtol=1e-6, atol=1e-8)
    no_z = oracle.loss_value_and_grad(spec.model_copy(update={"z_loss": 0.0}), x, y, **extra)
    assert np.abs(out["grad"] - no_z["grad"]).max() > 1e-3  # the z term really is in the gradient


def test_the_z_term_is_z_times_log_z_squared_over_the_valid_count() -> None:
    x = np.array([[0.0, np.log(3.0)], [1.0, 1.0], [2.0, 0.0]])
    y = np.array([1, -100, 0])
    log_z = np.log(np.exp(x).sum(1))
    ce = -(x[[0, 2], [1, 0]] - log_z[[0, 2]])
    out = oracle.loss_value_and_grad(LossSpec(z_loss=0.5), x, y)
    assert out["count"] == 2.0
    assert out["value"] == pytest.approx((ce.sum() + 0.5 * (log_z[0] ** 2 + log_z[2] ** 2)) / 2, abs=1e-15)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_sums_and_counts_of_micro_batches_add_up_to_the_full_batch(backend: str) -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 5)) * 3, np.array([0, 4, -100, 2, 1, -100, 3, 3])
    spec = LossSpec(z_loss=0.05, weight=[1.0, 0.5, 2.0, 1.5, 1.0])
    mod = _module(backend)
    with Backend(backend).context():
        full = mod.loss_value_and_grad(spec, x, y)
        parts = [mod.loss_value_and_grad(spec, x[s], y[s]) for s in (slice(0, 3), slice(3, 8))]
    total, count = sum(p["sum"] for p in parts), sum(p["count"] for p in parts)
    assert total == pytest.approx(full["sum"], rel=1e-14) and count == pytest.approx(full["count"], rel=1e-14)
    assert total / count == pytest.approx(float(full["value"]), rel=1e-14)


def _wrong(case_id: str, tmp_path: Path) -> Any:
    text = CASES[case_id].path.read_text(encoding="utf-8")
    head, _, tail = text.partition("value = ")
    number, _, rest = tail.partition("\n")
    bad = tmp_path / "wrong.toml"
    bad.write_text(f"{head}value = {float(number) * (1 + 1e-6)!r}\n{rest}", encoding="utf-8")
    return load_case(bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_z_loss_case_with_a_wrong_expected_value_fails(backend: str, tmp_path: Path) -> None:
    case = _wrong("loss/z-loss-ignore", tmp_path)
    result = run_case(case, Backend(backend))
    assert not result.passed and result.status == "failed", result.message
    assert run_case(CASES["loss/z-loss-ignore"], Backend(backend)).passed


def _planted(variant: str):
    """torch's loss_value_and_grad with a known wrong z-loss: an older OLMo's mean over every token
    (ignored ones in the divisor), the z term left out, or unweighted z terms under class weights."""
    import torch
    import torch.nn.functional as F

    def run(spec: LossSpec, prediction, target, weight=None, mask=None, sample_weight=None, dtype="float64"):
        check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
        x, y = torch.tensor(prediction, requires_grad=True), torch.tensor(target)
        w = None if spec.weight is None else torch.tensor(spec.weight, dtype=torch.float64)
        ce = F.cross_entropy(x, y, weight=w, ignore_index=spec.ignore_index, label_smoothing=spec.label_smoothing,
                             reduction=spec.reduction)
        valid = y != spec.ignore_index
        z2 = x.logsumexp(1).pow(2) * valid
        if variant == "every-token":
            z = (z2.sum() if spec.reduction == "sum" else z2.mean())
        elif variant == "no-z":
            z = torch.zeros(())
        else:
            z = z2.sum() / valid.sum()
        value = ce + spec.z_loss * z
        value.sum().backward()
        return {"value": value.detach().numpy(), "grad": x.grad.numpy(), "sum": float("nan"), "count": float("nan")}

    return run


@pytest.mark.parametrize("variant, case_id", [("every-token", "loss/z-loss-ignore"), ("no-z", "loss/z-loss-plain"),
                                              ("no-z", "loss/z-loss-large-logits"), ("unweighted", "loss/z-loss-weight")])
def test_the_cases_catch_a_planted_z_loss_bug(variant: str, case_id: str) -> None:
    bad = PatchedBackend("torch", patches=(("losses", "loss_value_and_grad", _planted(variant)),))
    result = run_case(CASES[case_id], bad)
    assert not result.passed, f"{variant} passed {case_id}: the case has no teeth"
    assert run_case(CASES[case_id], Backend("torch")).passed
