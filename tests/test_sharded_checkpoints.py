"""Sharded checkpoints (format 3), in one process: N "ranks" are threads that exchange bytes through a
barrier, as the trainers' all-gathers do (the twins' _parallel.gather_bytes).

- every layout loads into every other: written by 3 ranks, read whole (`load_checkpoint`), read slice by
  slice for 1, 2 or 4 ranks (`ShardedTensor.read`, which opens only the files holding the slice);
- the commit: every rank's file, the manifest only when all are durable; a rank that fails or dies
  leaves no checkpoint a resume would take (and the next run removes its temporary directory);
- bad input refused before any tensor file is read, one line naming the file: a missing rank's
  shard, pieces that do not tile (a gap, an overlap, outside the shape), a manifest naming a file
  outside the directory; a tampered shard is refused when read, a shard whose content differs from
  its table too. Each check has its negative control (the unchanged checkpoint loads);
- the resume rule for another world size (conformance.run.resume.check_resumable).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tamper import rehash_manifest

from conformance import checkpoint as ck
from conformance.checkpoint import files as cio
from conformance.config import dump_config, load_config
from conformance.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointRejected,
)
from conformance.run.resume import check_resumable

FULL = {
    "model/w": np.arange(7 * 4, dtype=np.float32).reshape(7, 4),
    "model/b": np.arange(2.0),  # 2 rows over 3 ranks: rank 2's part is empty
    "optimizer/w/m": np.linspace(0, 1, 28).reshape(7, 4),
    "optimizer/w/step": np.asarray(3, np.int64),  # 0-d: replicated, rank 0 writes it
    "ema/w": np.ones((7, 4), np.float32),
}
META = {"counters": {"updates_done": 5}}


def exchanger(world: int) -> Callable[[int], Callable[[bytes], list[bytes]]]:
    barrier = threading.Barrier(world, timeout=30)
    slots: list[bytes] = [b""] * world

    def of(rank: int) -> Callable[[bytes], list[bytes]]:
        def exchange(data: bytes) -> list[bytes]:
            slots[rank] = data
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

        exchange.barrier = barrier  # type: ignore[attr-defined]
        return exchange

    return of


def pieces_of(rank: int, world: int, full: dict[str, np.ndarray] = FULL) -> dict[str, Any]:
    out = {}
    for key, value in full.items():
        if value.ndim == 0:
            out[key] = (value, (), ())
            continue
        a, b = ck.dim0_slice(value.shape[0], rank, world)
        out[key] = (value[a:b], value.shape, (a,) + (0,) * (value.ndim - 1))
    return out


class Died(Exception):
    """A rank's process ending (SIGKILL) in the middle of a save."""


def save_ranks(directory: Path, world: int, update: int = 5,
               pieces: Callable[[int], dict[str, Any]] | None = None, dies: int | None = None) -> list[Any]:
    """Every rank's save_sharded in its own thread; each result is the path or the exception. Rank
    `dies` ends after writing its files, before reporting them (the survivors' collective breaks)."""
    of = exchanger(world)
    results: list[Any] = [None] * world

    def rank(r: int) -> None:
        state = ck.TrainingState(update, {}, None, {"rank0/x": np.zeros(2, np.uint32)}, META, "a = 1\n")
        exchange, calls = of(r), [0]

        def dying(data: bytes) -> list[bytes]:
            calls[0] += 1
            if calls[0] == 2:
                exchange.barrier.abort()
                raise Died
            return exchange(data)

        try:
            results[r] = ck.save_sharded(directory, state, (pieces or (lambda q: pieces_of(q, world)))(r), rank=r,
                                         world_size=world, exchange=dying if r == dies else exchange)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.fixture
def step(tmp_path: Path) -> Path:
    results = save_ranks(tmp_path, 3)
    assert all(r == tmp_path / "step-00000005" for r in results), results
    return tmp_path / "step-00000005"


def test_each_rank_writes_its_own_file_and_the_manifest_lists_every_piece(step: Path) -> None:
    names = sorted(p.name for p in step.iterdir())
    assert names == ["config.toml", "manifest.json", "rank-00000.safetensors", "rank-00001.safetensors",
                     "rank-00002.safetensors", "replicated.safetensors", "rng.safetensors", "state.json"]
    manifest = ck.verify_checkpoint(step)
    assert manifest["format_version"] == 3 and manifest["world_size"] == 3
    w = manifest["tensors"]["model/w"]
    assert w["shape"] == [7, 4] and w["dtype"] == "float32"
    assert [(p["file"], p["start"], p["stop"]) for p in w["pieces"]] == [
        ("rank-00000.safetensors", [0, 0], [3, 4]), ("rank-00001.safetensors", [3, 0], [6, 4]),
        ("rank-00002.safetensors", [6, 0], [7, 4])]
    assert [p["file"] for p in manifest["tensors"]["optimizer/w/step"]["pieces"]] == ["replicated.safetensors"]
    assert len(manifest["tensors"]["model/b"]["pieces"]) == 2  # rank 2's empty part is not written
    assert set(cio.load_tensors(step / "rank-00001.safetensors")) == {"model/w", "model/b", "optimizer/w/m", "ema/w"}


def test_a_sharded_checkpoint_loads_whole(step: Path) -> None:
    state = ck.load_checkpoint(step).state
    np.testing.assert_array_equal(state.model["w"], FULL["model/w"])
    np.testing.assert_array_equal(state.model["b"], FULL["model/b"])
    np.testing.assert_array_equal(state.optimizer["w"]["m"], FULL["optimizer/w/m"])
    assert int(state.optimizer["w"]["step"]) == 3 and state.optimizer["w"]["step"].shape == ()
    np.testing.assert_array_equal(state.ema["w"], FULL["ema/w"])
    assert state.meta == META and state.config == "a = 1\n"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_rank_of_another_world_size_reads_only_the_files_with_its_rows(step: Path, world: int) -> None:
    rows = []
    for rank in range(world):
        found = ck.load_checkpoint(step, lazy=True)
        w = found.state.model["w"]
        assert isinstance(w, ck.ShardedTensor) and w.shape == (7, 4)
        a, b = ck.dim0_slice(7, rank, world)
        rows.append(w.read((slice(a, b),)))
        assert set(w.shards._files) == set(w.files_for((slice(a, b),)))  # nothing else was opened
        if world == 4:
            assert len(w.shards._files) < 3
    np.testing.assert_array_equal(np.concatenate(rows), FULL["model/w"])
    # negative control: the rows of the writers' split are not this world's rows
    if world != 3:
        a, b = ck.dim0_slice(7, 0, world)
        assert not np.array_equal(ck.load_checkpoint(step, lazy=True).state.model["w"].read((slice(a, b),)),
                                  FULL["model/w"][0:3])


def test_a_whole_checkpoint_and_a_sharded_one_hold_the_same_state(step: Path, tmp_path: Path) -> None:
    sharded = ck.load_checkpoint(step).state
    whole = ck.load_checkpoint(ck.save_checkpoint(tmp_path / "whole", sharded._replace(update=5))).state
    for name in ("w", "b"):
        np.testing.assert_array_equal(whole.model[name], sharded.model[name])
    np.testing.assert_array_equal(whole.optimizer["w"]["m"], sharded.optimizer["w"]["m"])
    np.testing.assert_array_equal(whole.ema["w"], sharded.ema["w"])  # ema.safetensors: listed and loaded


def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    original = cio.read_verified

    def spy(directory: Path, name: str, *args: Any, **kwargs: Any) -> bytes:
        seen.append(name)
        return original(directory, name, *args, **kwargs)

    monkeypatch.setattr(cio, "read_verified", spy)
    return seen


def test_a_missing_rank_shard_is_refused_before_any_file_is_read(step: Path, monkeypatch) -> None:
    seen = reads(monkeypatch)
    (step / "rank-00001.safetensors").unlink()
    with pytest.raises(CheckpointCorruptError, match=r"rank-00001.safetensors does not exist"):
        ck.load_checkpoint(step)
    assert seen == []


def test_a_manifest_without_a_rank_is_refused_naming_the_shard(step: Path) -> None:
    def drop(m: dict[str, Any]) -> None:
        del m["files"]["rank-00002.safetensors"]
        for entry in m["tensors"].values():
            entry["pieces"] = [p for p in entry["pieces"] if p["file"] != "rank-00002.safetensors"]

    rehash_manifest(step, drop)
    (step / "rank-00002.safetensors").unlink()
    with pytest.raises(CheckpointCorruptError, match=r"does not list rank-00002.safetensors: rank 2's shard of a "
                                                     r"3-rank checkpoint is missing"):
        ck.load_checkpoint(step)


def piece(m: dict[str, Any], key: str, i: int) -> dict[str, Any]:
    return m["tensors"][key]["pieces"][i]


TILING = {
    "gap": (lambda m: piece(m, "model/w", 1)["start"].__setitem__(0, 4), "cover 24 of the 28 elements"),
    "overlap": (lambda m: piece(m, "model/w", 1)["start"].__setitem__(0, 2), "overlap"),
    "outside": (lambda m: piece(m, "model/w", 2)["stop"].__setitem__(0, 8), "lies outside the shape"),
    "dropped": (lambda m: m["tensors"]["model/w"]["pieces"].pop(2), "cover 24 of the 28"),
}


@pytest.mark.parametrize("bad", sorted(TILING))
def test_pieces_that_do_not_tile_are_refused_before_any_tensor_file_is_read(step: Path, monkeypatch,
                                                                          bad: str) -> None:
    change, match = TILING[bad]
    rehash_manifest(step, change)
    seen = reads(monkeypatch)
    with pytest.raises(CheckpointCorruptError, match=rf"manifest.json: tensors.model/w: .*{match}"):
        ck.load_checkpoint(step, lazy=True)
    assert seen == []


@pytest.mark.parametrize("name", ["../rank-00000.safetensors", "/etc/passwd", "sub/rank-00000.safetensors",
                                  "state.json"])
def test_a_piece_naming_a_file_outside_the_directory_is_refused(step: Path, monkeypatch, name: str) -> None:
    rehash_manifest(step, lambda m: piece(m, "model/w", 0).__setitem__("file", name))
    seen = reads(monkeypatch)
    with pytest.raises(CheckpointRejected, match=r"manifest.json: tensors.model/w.pieces\[0\].file names .* not a "
                                                 r"tensor file listed"):
        ck.load_checkpoint(step)
    assert seen == []


def test_the_files_table_naming_a_path_is_refused(step: Path) -> None:
    def add(m: dict[str, Any]) -> None:
        m["files"]["../rank-00003.safetensors"] = m["files"]["rank-00000.safetensors"]

    rehash_manifest(step, add)
    with pytest.raises(CheckpointRejected, match=r"unsafe or unknown file name '../rank-00003.safetensors'"):
        ck.load_checkpoint(step)


def test_negative_control_the_unchanged_rehashed_checkpoint_loads(step: Path) -> None:
    rehash_manifest(step)
    np.testing.assert_array_equal(ck.load_checkpoint(step).state.model["w"], FULL["model/w"])


def test_a_tampered_shard_is_refused_when_read(step: Path) -> None:
    path = step / "rank-00001.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.chmod(0o600)
    path.write_bytes(bytes(data))
    lazy = ck.load_checkpoint(step, lazy=True).state.model["w"]  # the small files verify
    lazy.read((slice(0, 3),))  # rank 0's rows: another file
    with pytest.raises(CheckpointCorruptError, match="rank-00001.safetensors fails its sha256 check"):
        lazy.read((slice(3, 5),))
    with pytest.raises(CheckpointCorruptError, match="rank-00001.safetensors fails its sha256 check"):
        ck.verify_checkpoint(step)


def test_a_shard_that_differs_from_its_table_is_refused(step: Path) -> None:
    tensors = dict(cio.load_tensors(step / "rank-00000.safetensors"))
    tensors["model/w"] = tensors["model/w"][:2]
    (step / "rank-00000.safetensors").chmod(0o600)
    (step / "rank-00000.safetensors").write_bytes(cio.encode_tensors(tensors, "t"))
    rehash_manifest(step)
    with pytest.raises(CheckpointCorruptError, match=r"rank-00000.safetensors: tensor 'model/w' is float32 \(2, 4\); "
                                                     r"the manifest says float32 \(3, 4\)"):
        ck.load_checkpoint(step)


def test_non_finite_optimizer_state_is_refused_when_its_slice_is_read(tmp_path: Path) -> None:
    bad = {**FULL, "optimizer/w/m": np.where(np.arange(28).reshape(7, 4) == 20, np.nan, 1.0)}
    save_ranks(tmp_path, 3, pieces=lambda r: pieces_of(r, 3, bad))
    m = ck.load_checkpoint(tmp_path / "step-00000005", lazy=True).state.optimizer["w"]["m"]
    m.read((slice(0, 3),))
    with pytest.raises(CheckpointCorruptError, match="optimizer/w/m contains a non-finite value"):
        m.read((slice(3, 7),))


def test_a_rank_that_fails_leaves_no_checkpoint_on_any_rank(tmp_path: Path) -> None:
    def pieces(r: int) -> dict[str, Any]:
        out = pieces_of(r, 2)
        if r == 1:
            out["model/w"] = (np.zeros((4, 4), np.complex64), (7, 4), (4, 0))  # cannot be written
        return out

    results = save_ranks(tmp_path, 2, pieces=pieces)
    assert all(isinstance(r, CheckpointError) for r in results), results
    assert "complex64" in str(results[0]) and str(results[0]) == str(results[1])
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone too


def test_a_rank_that_dies_mid_save_leaves_only_a_temporary_directory(tmp_path: Path) -> None:
    results = save_ranks(tmp_path, 2, dies=1)
    assert isinstance(results[1], Died) and isinstance(results[0], threading.BrokenBarrierError)
    assert ck.list_checkpoints(tmp_path) == [] and ck.find_latest(tmp_path) is None
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".tmp-step-00000005-")
    assert "rank-00001.safetensors" in {p.name for p in (tmp_path / left[0]).iterdir()}  # durable, not committed
    assert "manifest.json" not in {p.name for p in (tmp_path / left[0]).iterdir()}
    assert ck.prepare_directory(tmp_path) == [tmp_path / left[0]] and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# resuming at another world size: the global batch decides
# ---------------------------------------------------------------------------------------------


def saved(batch: int, steps: int = 3) -> str:
    return dump_config(load_config({"data": {"name": "binary_blobs", "batch_size": batch},
                                    "accumulation": {"steps": steps}}))


def now(batch: int, steps: int = 3) -> Any:
    return load_config({"data": {"name": "binary_blobs", "batch_size": batch}, "accumulation": {"steps": steps}})


@pytest.mark.parametrize(("world_then", "batch_then", "world_now", "batch_now"),
                         [(2, 12, 1, 24), (2, 12, 4, 6), (1, 24, 2, 12), (4, 6, 2, 12), (2, 12, 2, 12)])
def test_another_world_size_resumes_when_the_global_batch_is_the_same(world_then, batch_then, world_now,
                                                                      batch_now) -> None:
    check_resumable(saved(batch_then), now(batch_now), Path("ckpt"), world_then, world_now)


@pytest.mark.parametrize(("world_then", "batch_then", "world_now", "batch_now", "text"),
                         [(2, 12, 1, 12, "2 × 12 × 3 = 72 in the checkpoint and is 1 × 12 × 3 = 36 now"),
                          (2, 12, 2, 24, "2 × 12 × 3 = 72 in the checkpoint and is 2 × 24 × 3 = 144 now"),
                          (1, 24, 4, 24, "1 × 24 × 3 = 72 in the checkpoint and is 4 × 24 × 3 = 288 now")])
def test_a_changed_global_batch_is_refused_naming_the_three_fields(world_then, batch_then, world_now, batch_now,
                                                                   text: str) -> None:
    with pytest.raises(CheckpointError, match=r"the global batch \(world size × data.batch_size × "
                                              r"accumulation.steps\) was " + text):
        check_resumable(saved(batch_then), now(batch_now), Path("ckpt"), world_then, world_now)


def test_the_same_global_batch_with_other_micro_batches_is_refused() -> None:
    with pytest.raises(CheckpointError, match="accumulation.steps was 3 in the checkpoint and is 6 now"):
        check_resumable(saved(12, 3), now(6, 6), Path("ckpt"), 2, 2)


def test_a_resume_may_change_the_evaluations_unless_reduce_on_plateau_observes_them() -> None:
    def plateau(every: int) -> Any:
        return load_config({"data": {"name": "binary_blobs"}, "schedule": {"name": "reduce_on_plateau"},
                            "run": {"eval_every": every}})

    check_resumable(saved(12), load_config({"data": {"name": "binary_blobs", "batch_size": 12},
                                            "accumulation": {"steps": 3}, "run": {"eval_every": 7}}), Path("c"))
    check_resumable(dump_config(plateau(5)), plateau(5), Path("c"))  # negative control: unchanged
    with pytest.raises(CheckpointError, match="run.eval_every was 5 in the checkpoint and is 7 now"):
        check_resumable(dump_config(plateau(5)), plateau(7), Path("c"))
