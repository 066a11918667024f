"""The shared data pipeline: the seeds' data sets, real digits, text windows, shuffling, resume,
accumulation windows, distributed sharding, counts and host-side validation."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.config import dump_config, load_config
from conformance.data import (
    Batch,
    DataPipeline,
    Window,
    batch_hash,
    check_split,
    digits_raw,
    planned_updates,
    sampling,
    updates_per_epoch,
)
from conformance.data import datasets as ds_mod
from conformance.data.sampling import epoch_order, window_micro_batches
from conformance.errors import CheckpointError, ConfigError, InputError


def pipeline(config: dict, rank: int = 0, world: int = 1) -> DataPipeline:
    return DataPipeline(load_config(config), rank, world)


def lin(n: int, batch: int, steps: int = 1, drop_last: bool = False, epochs: int = 1, shuffle: bool = True) -> dict:
    return {"data": {"name": "linear_regression", "n_samples": n, "batch_size": batch, "drop_last": drop_last,
                     "shuffle": shuffle},
            "model": {"name": "linear"}, "accumulation": {"steps": steps}, "run": {"epochs": epochs, "seed": 3}}


# --- the seeds' data sets ----------------------------------------------------------------------


def test_linear_regression_is_seed_001() -> None:
    """Seed 001 §3.2: x = linspace(-1, 1, 64) as a column, y = 3x + 2, batch 16, 20 epochs."""
    p = pipeline({"data": {"name": "linear_regression", "batch_size": 16}, "model": {"name": "linear"},
                  "run": {"epochs": 20}})
    x, y = p.dataset.train.x, p.dataset.train.y
    assert x.shape == (64, 1) and p.info.n_val == 0
    assert x[0, 0] == -1.0 and x[-1, 0] == 1.0 and np.allclose(np.diff(x[:, 0]), 2.0 / 63, rtol=0, atol=1e-15)
    assert np.array_equal(y, 3.0 * x + 2.0)
    assert p.updates_per_epoch == 4 and p.planned_updates == 80  # 64 / 16 batches, 20 epochs


def test_binary_blobs_is_seed_000() -> None:
    """Seed 000: 4096 train / 1024 val, x ~ N(0,1)^20, label = x[:5].sum() > 0; batch 64 with
    accumulation 2 gives the seed's (len(loader) + 2 - 1) // 2 = 32 updates per epoch."""
    p = pipeline({"data": {"name": "binary_blobs", "batch_size": 64}, "model": {"name": "mlp"},
                  "accumulation": {"steps": 2}})
    tr, va = p.dataset.train, p.dataset.val
    assert (len(tr), len(va)) == (4096, 1024) and tr.x.shape[1] == 20
    for part in (tr, va):
        assert np.array_equal(part.y, (part.x[:, :5].sum(axis=1) > 0).astype(np.int64))
    allx = np.concatenate([tr.x, va.x])
    assert abs(allx.mean()) < 0.02 and abs(allx.std() - 1.0) < 0.02
    assert 0.45 < tr.y.mean() < 0.55
    assert p.updates_per_epoch == (64 + 2 - 1) // 2 == 32
    assert p.info.task == "classification" and p.info.n_classes == 2 and p.info.out_features == 2


def test_digits_is_scikit_learns() -> None:
    sklearn = pytest.importorskip("sklearn.datasets")
    ref = sklearn.load_digits()
    data, target = digits_raw()
    assert np.array_equal(data, ref.data) and np.array_equal(target, ref.target)
    p = pipeline({"data": {"name": "digits"}, "model": {"name": "mlp"}})
    assert p.info.n_train + p.info.n_val == 1797 and p.info.n_classes == 10 and p.info.in_features == 64
    assert p.info.n_val == 359  # round(1797 * 0.2)
    assert p.dataset.train.x.min() == 0.0 and p.dataset.train.x.max() == 1.0  # pixel counts / 16
    assert set(np.unique(p.dataset.val.y)) == set(range(10))


def test_digits_checksum_guards_the_asset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds_mod, "DIGITS_SHA256", "0" * 64)  # negative control: a wrong recorded digest
    with pytest.raises(InputError, match="digits.csv.gz"):
        digits_raw()


# --- text --------------------------------------------------------------------------------------


def test_text_default_corpus_windows() -> None:
    topics = importlib.import_module("pydoc_data.topics").topics
    corpus = "\n".join(topics[k] for k in sorted(topics))
    p = pipeline({"data": {"name": "text", "batch_size": 4},
                  "model": {"name": "gpt", "block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8}})
    vocab = p.info.vocab
    assert list(vocab) == sorted(set(corpus)) and p.info.out_features == len(vocab)
    n_val = int(np.floor(len(corpus) * 0.1 + 0.5))
    batch = p.window(5).batches[0]
    decode = lambda row: "".join(vocab[i] for i in row)  # noqa: E731
    for i, start in enumerate(p.dataset.train.starts[batch.index]):
        assert decode(batch.x[i]) == corpus[start:start + 16]
        assert decode(batch.y[i]) == corpus[start + 1:start + 17]  # targets: inputs shifted by one
    val = next(p.val_batches())
    assert decode(val.x[0]) == corpus[len(corpus) - n_val:][:16]


def test_text_user_file_hand_example(tmp_path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("abcabcab", encoding="utf-8")
    p = pipeline({"data": {"name": "text", "path": str(path), "batch_size": 2, "val_fraction": 0.0,
                           "shuffle": False, "block_size": 3},
                  "model": {"name": "gpt", "block_size": 4, "n_layer": 1, "n_head": 1, "n_embd": 4}})
    # 8 characters, windows of 3 + 1 at stride 3: starts 0 and 3 ("abc"→"bca", "abc"→"bca").
    assert p.info.vocab == ("a", "b", "c")
    b = p.window(0).batches[0]
    assert b.x.tolist() == [[0, 1, 2], [0, 1, 2]] and b.y.tolist() == [[1, 2, 0], [1, 2, 0]]


@pytest.mark.parametrize("content, error, match", [
    (b"\xff\xfe bad", InputError, "not UTF-8"),
    (b"ab", InputError, "too few"),
])
def test_text_bad_files(tmp_path, content: bytes, error: type, match: str) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(error, match=match):
        pipeline({"data": {"name": "text", "path": str(path)}, "model": {"name": "gpt", "block_size": 4}})


def test_text_config_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        pipeline({"data": {"name": "text", "path": str(tmp_path / "nope.txt")}, "model": {"name": "gpt"}})
    with pytest.raises(ConfigError, match="model.name"):
        pipeline({"data": {"name": "text"}, "model": {"name": "mlp"}})
    with pytest.raises(ConfigError, match="data.name"):
        pipeline({"data": {"name": "digits"}, "model": {"name": "gpt"}})
    with pytest.raises(ConfigError, match="data.block_size"):
        pipeline({"data": {"name": "text", "block_size": 65}, "model": {"name": "gpt", "block_size": 64}})


# --- shuffling and resume ----------------------------------------------------------------------


def test_epoch_order_is_the_documented_permutation() -> None:
    # Definition (docs/models.md): stable argsort of n raw PCG64 outputs seeded by
    # SeedSequence([seed, int("shuffle"), epoch]).
    ss = np.random.SeedSequence([7, int.from_bytes(b"shuffle", "big"), 2])
    expected = np.argsort(np.random.PCG64(ss).random_raw(50), kind="stable")
    assert np.array_equal(epoch_order(7, 2, 50), expected)
    assert np.array_equal(np.sort(expected), np.arange(50))
    assert not np.array_equal(epoch_order(7, 3, 50), expected) and not np.array_equal(epoch_order(8, 2, 50), expected)
    assert np.array_equal(epoch_order(7, 2, 50, shuffle=False), np.arange(50))


@pytest.mark.parametrize("drop_last", [False, True])
def test_an_epoch_visits_every_sample_once(drop_last: bool) -> None:
    p = pipeline(lin(n=37, batch=4, steps=3, drop_last=drop_last))
    seen = np.concatenate([b.index for t in range(p.updates_per_epoch) for b in p.window(t).batches])
    expected = 36 if drop_last else 37
    assert len(seen) == expected == len(set(seen.tolist()))
    nxt = np.concatenate([b.index for b in p.window(p.updates_per_epoch).batches])
    assert not np.array_equal(nxt, seen[: len(nxt)])  # epoch 1 is a new order


class StatefulPipeline(DataPipeline):
    """Negative control: a loader-style pipeline whose shuffle comes from a generator that is
    advanced as the run goes (what a DataLoader with an unsaved generator does)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._gen, self._epoch, self._order = np.random.default_rng(self.seed), -1, None

    def window(self, update: int) -> Window:
        epoch, w = self.locate(update)
        if self._order is None or epoch != self._epoch:
            self._order, self._epoch = self._gen.permutation(len(self.dataset.train)), epoch
        batches = []
        for j in window_micro_batches(w, self.steps, len(self.bounds)):
            start, stop = self.bounds[j]
            got = self.dataset.train.take(self._order[start:stop])
            batches.append(Batch(got["x"], got["y"], self._order[start:stop], epoch, j, stop - start))
        return Window(update, epoch, w, tuple(batches), self._window_sizes[w])


def resumed_batches_match(cls: type[DataPipeline], config: dict, resume_at: int, horizon: int) -> bool:
    """The check: a fresh pipeline asked for updates resume_at.. gives the uninterrupted run's batches."""
    full = cls(load_config(config))
    straight = [batch_hash(full.window(t)) for t in range(horizon)]
    resumed = cls(load_config(config))  # a new process: it never saw the earlier updates
    return straight[resume_at:] == [batch_hash(resumed.window(t)) for t in range(resume_at, horizon)]


def test_resume_mid_epoch_replays_the_same_batches() -> None:
    config = lin(n=30, batch=4, steps=2, epochs=4)
    assert resumed_batches_match(DataPipeline, config, resume_at=9, horizon=16)  # 4 updates/epoch: mid-epoch 2
    assert not resumed_batches_match(StatefulPipeline, config, resume_at=9, horizon=16)


# --- accumulation windows and counts -----------------------------------------------------------


def test_incomplete_last_window_policy() -> None:
    p = pipeline(lin(n=10, batch=2, steps=2))  # 5 micro-batches: windows of 2, 2, 1 (seed 000 keeps the last)
    assert p.updates_per_epoch == 3 and [len(p.window(t).batches) for t in range(3)] == [2, 2, 1]
    assert [p.window(t).global_samples for t in range(3)] == [4, 4, 2]
    assert p.samples_seen(3) == 10 and p.samples_seen(4) == 14
    assert p.window(3).epoch == 1 and p.window(3).window == 0
    drop = lin(n=10, batch=2, steps=2)
    drop["accumulation"]["last_window"] = "drop"
    q = pipeline(drop)
    assert q.updates_per_epoch == 2 and q.samples_seen(2) == 8 and q.window(2).epoch == 1


def test_counts_and_planned_updates() -> None:
    base = lin(n=64, batch=16, epochs=3)
    assert updates_per_epoch(load_config(base)) == 4 and planned_updates(load_config(base)) == 12
    base["run"]["max_updates"] = 7
    assert planned_updates(load_config(base)) == 7  # max_updates overrides epochs
    assert updates_per_epoch(load_config(base), world_size=2) == 2  # global micro-batch 32
    with pytest.raises(ConfigError, match="data.batch_size"):
        pipeline(lin(n=64, batch=100, drop_last=True))


# --- distributed sharding ----------------------------------------------------------------------


def ranks_match_one_process(n: int, batch: int, world: int, steps: int, drop_last: bool) -> bool:
    """The check: every update's micro-batches, concatenated over ranks in rank order, are exactly the
    one-process micro-batches of batch × world samples (same samples, same order, same counts)."""
    single = pipeline(lin(n, batch * world, steps, drop_last))
    ranks = [pipeline(lin(n, batch, steps, drop_last), r, world) for r in range(world)]
    if any(r.updates_per_epoch != single.updates_per_epoch for r in ranks):
        return False
    for t in range(2 * single.updates_per_epoch):
        one, parts = single.window(t), [r.window(t) for r in ranks]
        if any(len(p.batches) != len(one.batches) or p.global_samples != one.global_samples for p in parts):
            return False
        for j, mb in enumerate(one.batches):
            if not (np.array_equal(np.concatenate([p.batches[j].index for p in parts]), mb.index)
                    and np.array_equal(np.concatenate([p.batches[j].x for p in parts]), mb.x)):
                return False
            if mb.global_size == batch * world and any(len(p.batches[j].index) != batch for p in parts):
                return False
        if single.samples_seen(t + 1) != ranks[0].samples_seen(t + 1):
            return False
    return True


@given(n=st.integers(1, 40), batch=st.integers(1, 6), world=st.integers(1, 4), steps=st.integers(1, 3),
       drop_last=st.booleans())
def test_ranks_together_see_the_one_process_batches(n: int, batch: int, world: int, steps: int,
                                                    drop_last: bool) -> None:
    if drop_last and n < batch * world:
        return  # no complete micro-batch: a ConfigError, covered above
    assert ranks_match_one_process(n, batch, world, steps, drop_last)


def test_negative_control_distributed_sampler_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's DistributedSampler pads by repeating samples and deals them out r::world.
    def padded(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
        total = -(-len(indices) // world_size) * world_size
        return np.resize(indices, total)[rank::world_size]

    monkeypatch.setattr(sampling, "shard", padded)
    assert not ranks_match_one_process(n=10, batch=2, world=2, steps=1, drop_last=False)


def test_validation_batches_cover_the_split_once_across_ranks() -> None:
    cfg = {"data": {"name": "digits", "eval_batch_size": 50}, "model": {"name": "mlp"}}
    single = np.concatenate([b.index for b in pipeline(cfg).val_batches()])
    shards = [list(pipeline(cfg, r, 3).val_batches()) for r in range(3)]
    joined = np.concatenate([np.concatenate([s[j].index for s in shards]) for j in range(len(shards[0]))])
    assert np.array_equal(single, np.arange(359)) and np.array_equal(joined, single)


# --- hashing, positions, validation, config ----------------------------------------------------


def test_batch_hash_identifies_content() -> None:
    p = pipeline(lin(n=64, batch=16))
    w = p.window(2)
    assert batch_hash(w) == batch_hash(pipeline(lin(n=64, batch=16)).window(2))
    b = w.batches[0]
    x = b.x.copy()
    x[0, 0] = np.nextafter(x[0, 0], np.inf)  # negative control: one ulp changes the hash
    assert batch_hash(b._replace(x=x)) != batch_hash(b)


def test_position_round_trip_and_refusal() -> None:
    p = pipeline(lin(n=64, batch=16))
    pos = p.position(6)
    assert (pos["epoch"], pos["window_in_epoch"], pos["samples_seen"]) == (1, 2, 96)
    p.check_position(pos)
    other = lin(n=64, batch=16)
    other["run"]["seed"] = 4
    with pytest.raises(CheckpointError, match="run.seed"):
        pipeline(other).check_position(pos)


def test_host_validation_names_the_problem() -> None:
    x = np.zeros((4, 3))
    x[2, 1] = np.nan
    with pytest.raises(InputError, match=r"blobs train inputs contains a non-finite value \(nan\) at index \(2, 1\)"):
        check_split("blobs", "train", x, np.zeros(4, np.int64), "classification", 2)
    with pytest.raises(InputError, match="label 2 at index"):
        check_split("blobs", "train", np.zeros((4, 3)), np.array([0, 1, 2, 0]), "classification", 2)
    with pytest.raises(InputError, match="must be integers"):
        check_split("blobs", "train", np.zeros((4, 3)), np.zeros(4), "classification", 2)
    with pytest.raises(InputError, match="targets contains a non-finite"):
        check_split("lin", "train", np.zeros((2, 1)), np.array([[1.0], [np.inf]]), "regression", 1)
    check_split("blobs", "train", np.zeros((4, 3)), np.array([0, 1, 1, 0]), "classification", 2)


def test_resolved_config_states_dataset_defaults() -> None:
    c = load_config({"data": {"name": "binary_blobs"}})
    assert (c.data.n_samples, c.data.val_fraction) == (5120, 0.2)
    again = load_config(__import__("tomllib").loads(dump_config(c)))
    assert again.data == c.data
    assert load_config({"data": {"name": "linear_regression"}, "model": {"name": "linear"}}).data.val_fraction == 0.0


def test_data_seed_defaults_to_run_seed() -> None:
    a = pipeline({"run": {"seed": 1}})
    b = pipeline({"run": {"seed": 1}, "data": {"seed": 1}})
    c = pipeline({"run": {"seed": 1}, "data": {"seed": 2}})
    assert a.info.fingerprint == b.info.fingerprint != c.info.fingerprint
