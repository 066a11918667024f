"""The neutral checkpoint format: exact round trips, the manifest, integrity and refusal of tampered
or unsafe directories before anything is parsed, finding the latest, retention, and the framework
glue (weights and RNG) on torch and JAX."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from conformance import checkpoint as ck
from conformance.checkpoint import files as cio
from conformance.config.model import ModelSpec
from conformance.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointRejected,
)
from conformance.harness.backends import Backend

FILES = [*ck.FILES, ck.MANIFEST]


def sample_state(update: int = 7, fill: float | None = None) -> ck.TrainingState:
    rng = np.random.default_rng(update)
    w = rng.normal(size=(4, 3)).astype(np.float32) if fill is None else np.full((4, 3), fill, np.float32)
    return ck.TrainingState(
        update=update,
        model={"0.weight": w, "0.bias": rng.normal(size=4), "h": np.arange(5).astype(ml_dtypes.bfloat16),
               "half": np.linspace(0, 1, 3).astype(np.float16)},
        optimizer={"0.weight": {"m": rng.normal(size=(4, 3)), "v": rng.random((4, 3))}, "0.bias": {"m": np.zeros(4)}},
        rng={"torch_cpu": rng.integers(0, 255, 16).astype(np.uint8), "key": np.array([0, 7], np.uint32)},
        meta={"optimizer_step": update, "schedule": {"last_epoch": update}, "loss_scale": {"scale": 65536.0},
              "data": {"epoch": 1, "samples_seen": 123}, "flags": [True, None, "x"]},
        config='[model]\nname = "mlp"  # ünïcode\n',
    )


def assert_same(a: ck.TrainingState, b: ck.TrainingState) -> None:
    assert a.update == b.update and a.meta == b.meta and a.config == b.config
    for x, y in ((a.model, b.model), (a.rng, b.rng)):
        assert list(x) == list(y) or set(x) == set(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
            assert x[k].tobytes() == y[k].tobytes()
    assert {p: set(s) for p, s in a.optimizer.items()} == {p: set(s) for p, s in b.optimizer.items()}
    for p, states in a.optimizer.items():
        for name, value in states.items():
            assert value.tobytes() == b.optimizer[p][name].tobytes()


# --- writing and reading -----------------------------------------------------------------------


def test_round_trip_is_exact_and_owner_only(tmp_path) -> None:
    old = os.umask(0)  # the modes must not depend on a restrictive umask
    try:
        path = ck.save_checkpoint(tmp_path / "ckpt", sample_state(), versions={"torch": "x"}, val_loss=0.5)
    finally:
        os.umask(old)
    assert path.name == "step-00000007" and sorted(os.listdir(tmp_path / "ckpt")) == ["step-00000007"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(path / f).st_mode) == 0o600 for f in os.listdir(path))
    loaded = ck.load_checkpoint(path)
    assert_same(loaded.state, sample_state())
    m = loaded.manifest
    assert (m["format"], m["format_version"], m["update"], m["val_loss"]) == ("twinstep-checkpoint", 2, 7, 0.5)
    assert m["config_sha256"] == hashlib.sha256(sample_state().config.encode()).hexdigest()
    assert m["versions"]["torch"] == "x" and m["versions"]["numpy"] == np.__version__
    for name in ck.FILES:  # sizes and digests, recomputed independently
        data = (path / name).read_bytes()
        assert m["files"][name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # The tensors are plain safetensors: an independent reader sees the neutral names.
    plain = safetensors.numpy.load((path / "optimizer.safetensors").read_bytes())
    assert set(plain) == {"optimizer/0.weight/m", "optimizer/0.weight/v", "optimizer/0.bias/m"}


def test_saving_the_same_update_again_replaces_it(tmp_path) -> None:
    ck.save_checkpoint(tmp_path, sample_state(3))
    ck.save_checkpoint(tmp_path, sample_state(3, fill=2.0))
    assert np.all(ck.load_checkpoint(tmp_path / "step-00000003").state.model["0.weight"] == 2.0)
    assert os.listdir(tmp_path) == ["step-00000003"]


@pytest.mark.parametrize("bad, match", [
    ({"meta": {"loss": float("nan")}}, "checkpoint meta"),
    ({"meta": {"a": np.zeros(2)}}, "checkpoint meta"),
    ({"model": {"x": np.array(["a"])}}, "tensor 'x'"),
    ({"optimizer": {"w": {"a/b": np.zeros(1)}}}, "optimizer state name"),
])
def test_unwritable_state_is_refused_and_leaves_nothing(tmp_path, bad: dict, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        ck.save_checkpoint(tmp_path, sample_state()._replace(**bad))
    assert os.listdir(tmp_path) == []


# --- integrity: every damage is caught before parsing ------------------------------------------


def damaged(tmp_path, how: str, name: str):
    path = ck.save_checkpoint(tmp_path, sample_state())
    target = path / name
    if how == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x10
        target.write_bytes(bytes(data))
    elif how == "truncate":
        target.write_bytes(target.read_bytes()[:-3])
    elif how == "delete":
        target.unlink()
    elif how == "symlink":  # same bytes, but through a link
        copy = tmp_path / "elsewhere"
        shutil.copy(target, copy)
        target.unlink()
        target.symlink_to(copy)
    elif how == "group-writable":
        os.chmod(target, 0o620)
    return path


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("how, error", [
    ("flip", CheckpointError), ("truncate", CheckpointError), ("delete", CheckpointCorruptError),
    ("symlink", CheckpointRejected), ("group-writable", CheckpointRejected),
])
def test_damage_is_refused_naming_the_file(tmp_path, monkeypatch, name: str, how: str, error: type) -> None:
    path = damaged(tmp_path, how, name)
    parsed = []
    monkeypatch.setattr(cio.safetensors, "deserialize", lambda data: parsed.append(1))
    with pytest.raises(error, match=name.replace(".", r"\.")):
        ck.load_checkpoint(path)
    assert parsed == []  # no tensor file was parsed before the refusal
    with pytest.raises(error):
        ck.verify_checkpoint(path)


def test_random_bit_flips_are_all_caught_and_would_pass_a_plain_reader(tmp_path) -> None:
    path = ck.save_checkpoint(tmp_path / "c", sample_state())
    pristine = {f: (path / f).read_bytes() for f in ck.FILES}
    rng = random.Random(6)
    silent = 0
    for trial in range(60):
        name = rng.choice(ck.FILES)
        data = bytearray(pristine[name])
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (path / name).write_bytes(bytes(data))
        with pytest.raises(CheckpointCorruptError, match=name):
            ck.load_checkpoint(path)
        (path / name).write_bytes(pristine[name])
        silent += name.endswith(".safetensors") and loads_silently_wrong(bytes(data), pristine[name])
    assert silent > 0  # a reader that trusts the format alone loads wrong values without a word
    ck.load_checkpoint(path)


def loads_silently_wrong(damaged_bytes: bytes, pristine: bytes) -> bool:
    """Negative control: a reader that trusts the safetensors format alone, without the manifest."""
    try:
        loaded = safetensors.numpy.load(damaged_bytes)
    except Exception:
        return False  # this damage the format itself reveals
    before = safetensors.numpy.load(pristine)
    return set(loaded) != set(before) or any(loaded[k].tobytes() != before[k].tobytes() for k in before)


def edit_manifest(path, change, rehash: bool = True) -> None:
    """Change the manifest as a tamperer who knows the format would: with `rehash`, its own hash
    (manifest_sha256) is recomputed and it is written canonically, so only the schema's checks and
    the other files' hashes stand in the way."""
    m = json.loads((path / ck.MANIFEST).read_text())
    change(m)
    os.chmod(path / ck.MANIFEST, 0o600)
    if rehash:
        m.pop("manifest_sha256", None)
        m["manifest_sha256"] = hashlib.sha256(cio.encode_json(m, "m")).hexdigest()
        (path / ck.MANIFEST).write_bytes(cio.encode_json(m, "m"))
    else:
        (path / ck.MANIFEST).write_text(json.dumps(m))


@pytest.mark.parametrize("change, error, match", [
    (lambda m: m["files"].__setitem__("../escape", m["files"].pop("state.json")), CheckpointRejected, "unsafe"),
    (lambda m: m["files"].__setitem__("/etc/passwd", m["files"].pop("state.json")), CheckpointRejected, "unsafe"),
    (lambda m: m["files"].__setitem__("sub/x", m["files"].pop("state.json")), CheckpointRejected, "unsafe"),
    (lambda m: m.__setitem__("update", 9), CheckpointRejected, "says update 9"),
    (lambda m: m.__setitem__("format_version", 99), CheckpointRejected, "newer"),
    (lambda m: m.__setitem__("format", "orbax"), CheckpointRejected, "not a twinstep"),
    (lambda m: m["files"].pop("config.toml"), CheckpointCorruptError, "does not list config.toml"),
    (lambda m: m["files"]["model.safetensors"].__setitem__("size", "12"), CheckpointCorruptError,
     "files.model.safetensors.size must be an integer"),
])
def test_tampered_manifest_is_refused(tmp_path, change, error: type, match: str) -> None:
    path = ck.save_checkpoint(tmp_path, sample_state())
    edit_manifest(path, change)
    with pytest.raises(error, match=match):
        ck.load_checkpoint(path)


def test_unsafe_directories_are_refused(tmp_path) -> None:
    path = ck.save_checkpoint(tmp_path / "a", sample_state())
    (path / "extra.bin").write_bytes(b"x")
    with pytest.raises(CheckpointRejected, match="extra.bin"):
        ck.load_checkpoint(path)
    (path / "extra.bin").unlink()
    os.chmod(path, 0o777)
    with pytest.raises(CheckpointRejected, match="world-writable"):
        ck.load_checkpoint(path)
    os.chmod(path, 0o700)
    link = tmp_path / "a" / "step-00000008"
    link.symlink_to(path)
    with pytest.raises(CheckpointRejected, match="symbolic link|not a regular directory"):
        ck.load_checkpoint(link)


# --- finding the latest, retention, crash clean-up ---------------------------------------------


def test_find_latest_skips_temporaries_and_refuses_corruption(tmp_path) -> None:
    assert ck.find_latest(tmp_path / "missing") is None and ck.find_latest(tmp_path) is None
    for u in (1, 2, 3):
        ck.save_checkpoint(tmp_path, sample_state(u))
    (tmp_path / ".tmp-step-00000009-deadbeef").mkdir()
    assert ck.find_latest(tmp_path) == tmp_path / "step-00000003"
    data = bytearray((tmp_path / "step-00000003" / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (tmp_path / "step-00000003" / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="step-00000003/model.safetensors"):
        ck.find_latest(tmp_path)  # no silent fallback
    skipped = []
    assert ck.find_latest(tmp_path, allow_fallback=True, on_skip=lambda p, e: skipped.append(p.name)) == \
        tmp_path / "step-00000002"
    assert skipped == ["step-00000003"]
    for u in (1, 2):
        (tmp_path / ck.step_name(u) / "state.json").unlink()
    with pytest.raises(CheckpointCorruptError, match="no checkpoint"):
        ck.find_latest(tmp_path, allow_fallback=True, on_skip=lambda p, e: None)


def test_retention_keeps_the_newest_and_the_best(tmp_path) -> None:
    losses = [5.0, 1.0, 4.0, 3.0, 2.0, 6.0]
    for u, loss in enumerate(losses, start=1):
        ck.save_checkpoint(tmp_path, sample_state(u), val_loss=loss, keep_last=2, keep_best=True)
        kept = [p.name for _, p in ck.list_checkpoints(tmp_path)]
        assert len(kept) <= 3 and kept[0] == ck.step_name(u)
    assert [u for u, _ in ck.list_checkpoints(tmp_path)] == [6, 5, 2]  # newest two + best (loss 1.0)
    ck.save_checkpoint(tmp_path, sample_state(7), keep_last=1)
    assert [u for u, _ in ck.list_checkpoints(tmp_path)] == [7]


def test_retention_leaves_newer_checkpoints_and_survives_failed_deletes(tmp_path, monkeypatch) -> None:
    for u in (5, 9):
        ck.save_checkpoint(tmp_path, sample_state(u))
    ck.save_checkpoint(tmp_path, sample_state(6), keep_last=1)  # e.g. resumed from 5 after 9 was refused
    assert [u for u, _ in ck.list_checkpoints(tmp_path)] == [9, 6]
    monkeypatch.setattr(ck.format.shutil, "rmtree", lambda p, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.warns(UserWarning, match="could not delete"):
        assert ck.save_checkpoint(tmp_path / "b", sample_state(1)) and ck.save_checkpoint(
            tmp_path / "b", sample_state(2), keep_last=1)
    assert ck.find_latest(tmp_path / "b").name == "step-00000002"


def test_prepare_directory_cleans_up_after_a_crash(tmp_path) -> None:
    ck.save_checkpoint(tmp_path, sample_state(4))
    (tmp_path / ".tmp-step-00000005-0123abcd").mkdir()
    os.rename(tmp_path / "step-00000004", tmp_path / ".tmp-replaced-step-00000004-0123abcd")  # died mid-replace
    removed = ck.prepare_directory(tmp_path)
    assert [p.name for p in removed] == [".tmp-step-00000005-0123abcd"]
    assert os.listdir(tmp_path) == ["step-00000004"] and ck.find_latest(tmp_path).name == "step-00000004"


# --- framework glue ----------------------------------------------------------------------------

SPEC = ModelSpec(name="mlp", in_features=5, out_features=3, hidden=[4])


@pytest.mark.parametrize("source, target", [("torch", "jax"), ("jax", "torch"), ("torch", "torch"), ("jax", "jax")])
def test_weights_cross_frameworks_through_a_checkpoint(tmp_path, source: str, target: str) -> None:
    a, b = Backend(source), Backend(target)
    with a.context():
        model = a.module("models").build_model(SPEC, None, seed=1, dtype="float64")
        state = a.module("checkpoint").model_state(model)
    ck.save_checkpoint(tmp_path, ck.TrainingState(1, state))
    loaded = ck.load_checkpoint(tmp_path / "step-00000001").state.model
    with b.context():
        other = b.module("models").build_model(SPEC, None, seed=2, dtype="float64")
        b.module("checkpoint").load_model_state(other, loaded)
        back = b.module("checkpoint").model_state(other)
    assert all(back[k].dtype == np.float64 and back[k].tobytes() == state[k].tobytes() for k in state)


@pytest.mark.parametrize("change, match", [
    (lambda t: t.pop("0.bias"), "lacks tensor model/0.bias"),
    (lambda t: t.__setitem__("9.weight", np.zeros(2, np.float32)), "model/9.weight is not a parameter"),
    (lambda t: t.__setitem__("0.weight", t["0.weight"].T.copy()), r"model/0.weight has shape \(5, 4\)"),
    (lambda t: t.__setitem__("0.weight", t["0.weight"].astype(np.float64)), "model/0.weight is float64"),
])
def test_mismatched_weights_are_refused_and_change_nothing(framework: Backend, change, match: str) -> None:
    glue, models = framework.module("checkpoint"), framework.module("models")
    model = models.build_model(SPEC, None, seed=1)
    before = glue.model_state(model)
    bad = dict(before)
    change(bad)
    with pytest.raises(CheckpointError, match=match):
        glue.load_model_state(model, bad)
    assert all(glue.model_state(model)[k].tobytes() == v.tobytes() for k, v in before.items())


def test_torch_rng_round_trip() -> None:
    import torch

    from ref_torch import checkpoint as tc

    tensors, meta = tc.capture_rng()
    assert tensors["torch_cpu"].dtype == np.uint8 and tensors["python_random"].dtype == np.uint32
    want = (torch.rand(4), random.random(), np.random.rand())
    torch.manual_seed(99), random.seed(99), np.random.seed(99)  # scramble, as a fresh process would be
    assert tc.restore_rng(tensors, meta) is None
    assert torch.equal(torch.rand(4), want[0]) and random.random() == want[1] and np.random.rand() == want[2]
    gen = torch.Generator().manual_seed(5)
    t2, m2 = tc.capture_rng(gen)
    expected = torch.rand(3, generator=gen)
    assert torch.equal(torch.rand(3, generator=tc.restore_rng(t2, m2)), expected)


def test_jax_rng_round_trip_through_a_checkpoint(tmp_path) -> None:
    import jax

    from ref_jax import checkpoint as jc

    key = jax.random.split(jax.random.key(11))[1]
    tensors, meta = jc.capture_rng(key)
    assert tensors["jax_key"].dtype == np.uint32 and meta["jax_key"]["impl"] == "threefry2x32"
    ck.save_checkpoint(tmp_path, ck.TrainingState(1, {}, rng=tensors, meta={"rng": meta}))
    loaded = ck.load_checkpoint(tmp_path / "step-00000001").state
    restored = jc.restore_rng(loaded.rng, loaded.meta["rng"])
    assert np.array_equal(jax.random.uniform(restored, (3,)), jax.random.uniform(key, (3,)))
    # Each framework ignores the other's generator states.
    from ref_torch import checkpoint as tc

    assert tc.restore_rng(loaded.rng, loaded.meta["rng"]) is None


def test_a_forged_pickle_payload_never_runs(tmp_path) -> None:
    # reliability.md T5: an attacker replaces the tensors with a pickle whose loading would create a
    # marker file, and rewrites the manifest to match. The format never unpickles: refused, no marker.
    marker = tmp_path / "pwned"
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()  # protocol-0 pickle calling os.system
    path = ck.save_checkpoint(tmp_path / "c", sample_state())
    os.chmod(path / "model.safetensors", 0o600)
    (path / "model.safetensors").write_bytes(payload)
    edit_manifest(path, lambda m: m["files"].__setitem__(
        "model.safetensors", {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}))
    with pytest.raises(CheckpointCorruptError, match="model.safetensors is not a valid safetensors file"):
        ck.load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("target", ["manifest.json", "model.safetensors", "state.json"])
def test_arbitrary_bytes_only_raise_checkpoint_errors(tmp_path_factory, target: str) -> None:
    # reliability.md T7: whatever a file holds (hash made to match), only CheckpointError escapes.
    from hypothesis import given
    from hypothesis import strategies as st

    path = ck.save_checkpoint(tmp_path_factory.mktemp("fuzz"), sample_state())
    pristine = (path / target).read_bytes()

    @given(st.one_of(st.binary(max_size=200), st.builds(lambda cut, junk: pristine[:cut] + junk,
                                                         st.integers(0, len(pristine)), st.binary(max_size=16))))
    def check(blob: bytes) -> None:
        (path / target).write_bytes(blob)
        if target != ck.MANIFEST:
            edit_manifest(path, lambda m: m["files"].__setitem__(
                target, {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}))
        try:
            ck.load_checkpoint(path)
        except CheckpointError:
            pass

    try:
        check()
    finally:
        (path / target).write_bytes(pristine)
