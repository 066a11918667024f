"""Data in files: llm.c token shards (`[data] name = "tokens"`), NumPy arrays
(`[data] name = "arrays"`) and `twinstep data tokenize`.

- Shards: the header is checked (magic 20240520, version 1, file size = 1024 + 2·count) and every
  token against model.vocab_size; each mistake is one line naming the file (and, for a token, its
  index and byte offset). `twinstep train` refuses a corrupt shard with exit 2, no traceback and
  nothing written; on good shards a gpt's loss falls, on both trainers. Windows of block_size + 1
  never cross a shard boundary.
- Arrays: an .npz written by np.savez and a directory of .npy files are memory-mapped, and train
  exactly as the same arrays passed to train(data=...); a compressed .npz is refused.
- tokenize: bytes (the file's UTF-8 bytes) and a Hugging Face tokenizer.json (the `tokenizers`
  package), validation = the last fraction of each file, shards rolled over at --shard-tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.processes import PROCESS_S, run_process
from support.resume import VOLATILE
from support.trainers import Trainer

from conformance import tomlio
from conformance.config import load_config
from conformance.data.arrays import load_arrays, open_arrays
from conformance.data.shards import HEADER_BYTES, MAGIC, ShardWriter, read_header
from conformance.data.tokenize import tokenize
from conformance.data.tokens import load_tokens
from conformance.errors import ConfigError, InputError
from conformance.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def shard(path: Path, tokens: np.ndarray) -> Path:
    with ShardWriter(path) as w:
        w.write(tokens)
    return path


def corrupt(path: Path, index: int, value: int) -> Path:
    raw = bytearray(path.read_bytes())
    raw[4 * index:4 * index + 4] = np.int32(value).tobytes()
    path.write_bytes(bytes(raw))
    return path


def gpt_config(train: str, val: str | None = None, **run: object) -> dict:
    data = {"name": "tokens", "path": train, "batch_size": 8, **({"val_path": val} if val else {})}
    return {"model": {"name": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 256},
            "data": data, "optimizer": {"name": "adamw", "lr": 1e-2},
            "run": {"max_updates": 40, "eval_every": 20, "device": "cpu", **run}}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("TWINSTEP_DEBUG", None)
    return run_process([sys.executable, "-m", "conformance", *args], f"finish twinstep {args[0]}", PROCESS_S, env=env,
                       capture_output=True, text=True)


# --- the shard format ---------------------------------------------------------------------------


def test_a_written_shard_has_the_llmc_layout(tmp_path: Path) -> None:
    path = shard(tmp_path / "a.bin", np.arange(300) % 256)
    raw = path.read_bytes()
    assert np.frombuffer(raw[:12], "<i4").tolist() == [MAGIC, 1, 300] and len(raw) == HEADER_BYTES + 600
    assert np.array_equal(np.frombuffer(raw[HEADER_BYTES:], "<u2"), np.arange(300) % 256)
    assert read_header(path).count == 300


@pytest.mark.parametrize(("index", "value", "message"), [
    (0, 12345, "header magic is 12345, not 20240520 (not an llm.c token shard)"),
    (1, 2, "header version is 2, not 1 (uint16 tokens); other versions are not supported"),
    (2, 301, "the file has 1624 bytes, but its header says 301 tokens (1626 bytes); truncated, or not a token shard"),
])
def test_a_corrupt_header_is_one_line_naming_the_file(tmp_path: Path, index: int, value: int, message: str) -> None:
    path = corrupt(shard(tmp_path / "bad.bin", np.arange(300) % 256), index, value)
    with pytest.raises(InputError) as err:
        read_header(path)
    assert str(err.value) == f"data.path: {path}: {message}"


def test_a_truncated_file_and_a_token_beyond_the_vocabulary_are_caught(tmp_path: Path) -> None:
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 100)
    with pytest.raises(InputError, match=f"data.path: {short}: the file has 100 bytes, fewer than the 1024-byte header"):
        read_header(short)
    tokens = np.zeros(50, np.int64)
    tokens[37] = 300
    path = shard(tmp_path / "t.bin", tokens)
    spec = load_config(gpt_config(str(path))).data
    with pytest.raises(InputError) as err:
        load_tokens(spec, 8, vocab_size=256)
    assert str(err.value) == (f"data.path: {path}: token 300 at token index 37 (byte offset {HEADER_BYTES + 74}) "
                              f"is out of range 0..255 (model.vocab_size = 256)")


def test_windows_stay_inside_their_shard(tmp_path: Path) -> None:
    a = shard(tmp_path / "train_0.bin", np.arange(0, 40))
    shard(tmp_path / "train_1.bin", np.arange(100, 125))
    spec = load_config({**gpt_config(str(tmp_path / "train_*.bin")), "data": {
        "name": "tokens", "path": str(tmp_path / "train_*.bin"), "stride": 4}}).data
    ds = load_tokens(spec, 8)
    # shard 0: starts 0, 4, ..., 28 (8 windows of 9 tokens in 40); shard 1: starts 0, 4, ..., 16 (5 in 25)
    assert len(ds.train) == 13 and ds.info.n_val == 0 and read_header(a).count == 40
    got = ds.train.take(np.array([7, 8, 12]))
    assert got["x"][0].tolist() == list(range(28, 36)) and got["y"][0].tolist() == list(range(29, 37))
    assert got["x"][1].tolist() == list(range(100, 108)) and got["y"][2].tolist() == list(range(117, 125))


def test_an_empty_glob_is_a_config_error(tmp_path: Path) -> None:
    spec = load_config(gpt_config(str(tmp_path / "nothing_*.bin"))).data
    with pytest.raises(ConfigError, match="data.path: no file matches"):
        load_tokens(spec, 8)


# --- training on shards ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokens")
    (out / "corpus.txt").write_text(TEXT)
    tokenize([str(out / "corpus.txt")], out / "shards", val_fraction=0.2, progress=False)
    return out / "shards"


def test_twinstep_train_on_token_shards_learns(trainer: Trainer, shards: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(tomlio.dumps(gpt_config(str(shards / "train_*.bin"), str(shards / "val_*.bin"))))
    proc = cli("train", str(config), "--backend", trainer.name, "--out", str(tmp_path / "run"), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    losses = [r["loss"] for r in records if r["event"] == "update"]
    assert np.mean(losses[-5:]) < 0.5 * losses[0]
    assert all(r["tokens_per_s"] > 0 for r in records if r["event"] == "update")
    assert [r["update"] for r in records if r["event"] == "eval"] == [19, 39]


def test_twinstep_train_refuses_a_corrupt_shard(shards: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes((shards / "train_000000.bin").read_bytes())
    corrupt(bad, 0, 7)
    config = tmp_path / "run.toml"
    config.write_text(tomlio.dumps(gpt_config(str(bad))))
    proc = cli("train", str(config), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr == f"twinstep: error: data.path: {bad}: header magic is 7, not 20240520 (not an llm.c token shard)\n"
    assert not (tmp_path / "run").exists()


# --- arrays in files ------------------------------------------------------------------------------


def test_arrays_in_files_are_memory_mapped_and_train_as_arrays_passed_in(trainer: Trainer, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((120, 5)), rng.integers(0, 3, 120)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    (tmp_path / "dir").mkdir()
    np.save(tmp_path / "dir" / "x.npy", x)
    np.save(tmp_path / "dir" / "y.npy", y)
    base = {"model": {"name": "mlp", "hidden": [4], "out_features": 3}, "data": {"batch_size": 16, "val_fraction": 0.1},
            "run": {"max_updates": 5, "eval_every": 5, "device": "cpu"}}
    runs = {}
    for name, path in (("npz", tmp_path / "d.npz"), ("npy", tmp_path / "dir")):
        cfg = {**base, "data": {**base["data"], "name": "arrays", "path": str(path)}}
        ds = load_arrays(load_config(cfg).data, 0)
        assert isinstance(ds.train.source.arrays["x"], np.memmap)
        runs[name] = trainer.train(cfg, tmp_path / name)
    runs["given"] = trainer.train(base, tmp_path / "given", data={"x": x, "y": y})
    lines = {k: [{f: v for f, v in r.items() if f not in VOLATILE} for r in read_metrics(tmp_path / k / "metrics.jsonl")]
             for k in runs}
    assert lines["npz"] == lines["npy"] == lines["given"]


def test_a_compressed_npz_is_refused(tmp_path: Path) -> None:
    np.savez_compressed(tmp_path / "c.npz", x=np.zeros((4, 2)), y=np.zeros(4, np.int64))
    with pytest.raises(InputError, match=r"c.npz member x.npy is compressed \(np.savez_compressed\)"):
        open_arrays(str(tmp_path / "c.npz"), "data.path")



def _arrays(tmp_path: Path, bad: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((200, 5))
    if bad is not None:
        x[bad] = np.nan
    return x, (x[:, 0] > 0).astype(np.int64)


@pytest.mark.parametrize("val_fraction", [0.0, 0.2], ids=["train", "split"])
def test_a_nan_in_an_array_file_is_named_by_file_row_and_column(tmp_path: Path, val_fraction: float) -> None:
    x, y = _arrays(tmp_path, (17, 3))
    np.savez(tmp_path / "d.npz", x=x, y=y)
    spec = load_config({"data": {"name": "arrays", "path": str(tmp_path / "d.npz"), "val_fraction": val_fraction}}).data
    with pytest.raises(InputError, match=rf"^{tmp_path / 'd.npz'} entry 'x' holds a non-finite value \(nan\) at row 17, "
                                         r"column 3$"):
        load_arrays(spec, 0)  # with the split, row 17 is the validation part's 4th: still named row 17


def test_a_nan_in_a_validation_npy_is_named_by_its_file(tmp_path: Path) -> None:
    for name, bad in (("train", None), ("val", (5, 1))):
        x, y = _arrays(tmp_path, bad)
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "x.npy", x)
        np.save(tmp_path / name / "y.npy", y)
    spec = load_config({"data": {"name": "arrays", "path": str(tmp_path / "train"),
                                 "val_path": str(tmp_path / "val")}}).data
    with pytest.raises(InputError, match=rf"^{tmp_path / 'val' / 'x.npy'} holds a non-finite value \(nan\) at row 5, "
                                         r"column 1$"):
        load_arrays(spec, 0)


def test_negative_control_finite_array_files_load(tmp_path: Path) -> None:
    x, y = _arrays(tmp_path, None)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    ds = load_arrays(load_config({"data": {"name": "arrays", "path": str(tmp_path / "d.npz"), "val_fraction": 0.2}}).data, 0)
    assert (ds.info.n_train, ds.info.n_val) == (160, 40)

# --- tokenize ---------------------------------------------------------------------------------------


def _tokens(path: Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes()[HEADER_BYTES:], "<u2")


def test_tokenize_bytes_splits_each_file_and_rolls_shards(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("héllo wörld\n" * 30)
    b.write_text("second file\n" * 10)
    proc = cli("data", "tokenize", str(a), str(b), "-o", str(tmp_path / "out"), "--val-fraction", "0.1",
               "--shard-tokens", "100", "--progress", "none")
    assert proc.returncode == 0, proc.stderr
    ra, rb = a.read_bytes(), b.read_bytes()
    cut_a, cut_b = len(ra) - round(len(ra) * 0.1), len(rb) - round(len(rb) * 0.1)
    train = np.concatenate([_tokens(p) for p in sorted((tmp_path / "out").glob("train_*.bin"))])
    val = np.concatenate([_tokens(p) for p in sorted((tmp_path / "out").glob("val_*.bin"))])
    assert train.tobytes() == np.frombuffer(ra[:cut_a] + rb[:cut_b], np.uint8).astype("<u2").tobytes()
    assert val.tobytes() == np.frombuffer(ra[cut_a:] + rb[cut_b:], np.uint8).astype("<u2").tobytes()
    assert all(read_header(p).count == 100 for p in sorted((tmp_path / "out").glob("train_*.bin"))[:-1])
    assert "vocabulary 256" in proc.stderr
    again = cli("data", "tokenize", str(a), "-o", str(tmp_path / "out"))
    assert again.returncode == 2 and "already holds token shards" in again.stderr


def test_tokenize_with_a_tokenizer_json(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "the": 1, "fox": 2, "dog": 3}, "[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    text = tmp_path / "t.txt"
    text.write_text("the fox\nthe dog jumps\n")
    s = tokenize([str(text)], tmp_path / "out", tokenizer=str(tmp_path / "tokenizer.json"), progress=False)
    assert s.vocab_size == 4 and _tokens(s.train_shards[0]).tolist() == [1, 2, 1, 3, 0]
    assert s.tokenizer == tmp_path / "out" / "tokenizer.json"  # a copy beside the shards, byte for byte
    assert s.tokenizer.read_bytes() == (tmp_path / "tokenizer.json").read_bytes()


def test_tokenize_writes_the_byte_tokenizer_beside_the_shards(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    (tmp_path / "a.txt").write_text("héllo\n")
    s = tokenize([str(tmp_path / "a.txt")], tmp_path / "out", progress=False)
    tok = tokenizers.Tokenizer.from_file(str(s.tokenizer))
    assert tok.encode("héllo", add_special_tokens=False).ids == list("héllo".encode()) == _tokens(s.train_shards[0]
                                                                                                 ).tolist()[:6]


@pytest.mark.parametrize("head, refused", [(b"\x7fELF\x02\x01\x01\x00", True), ("plain text\n".encode(), False)],
                         ids=["binary", "text-control"])
def test_tokenize_refuses_a_binary_file_before_writing(tmp_path: Path, head: bytes, refused: bool) -> None:
    (tmp_path / "prog").write_bytes(head + b"more bytes" * 100)
    proc = cli("data", "tokenize", str(tmp_path / "prog"), "-o", str(tmp_path / "out"), "--progress", "none")
    if refused:
        assert proc.returncode == 2 and f"{tmp_path / 'prog'} looks binary (a NUL byte at offset 7)" in proc.stderr
        assert not (tmp_path / "out").exists()
    else:
        assert proc.returncode == 0 and (tmp_path / "out" / "tokenizer.json").is_file()
