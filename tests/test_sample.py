"""`twinstep sample` (conformance.generate, the twins' models.last_logits): text from a trained gpt.

- the choice rule against hand calculation: greedy is the argmax, top-k keeps ties at the k-th,
  the inverse CDF at a known draw;
- a float64 run samples the same text on torch and JAX with the same seed (controls: another
  seed, and another temperature, give other text), the requested number of characters;
- greedy decoding equals transformers' GPT2LMHeadModel.generate on the run exported with
  `twinstep export --to hf`;
- token-shard runs: the tokenizer.json `data tokenize` left beside the shards encodes the prompt
  and decodes the text (greedy = transformers' generate, decoded by the tokenizers package;
  control: without it the run is refused in one line saying why, and --tokenizer PATH works); a
  byte run continues a prompt with a two-byte character;
- refusals are one line (a prompt character outside the vocabulary, a run that is not a gpt).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conformance.cli import main
from conformance.generate import choose
from ref_torch.trainer import train

CONFIG = {"model": {"name": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 32},
          "data": {"name": "text", "corpus": "tinyshakespeare", "batch_size": 8},
          "optimizer": {"name": "adamw", "lr": 3e-3}, "precision": {"dtype": "float64"},
          "checkpoint": {"every": 0, "at_end": True}, "run": {"max_updates": 30, "eval_every": 0, "seed": 2}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample") / "run"
    train(CONFIG, out, progress="none")
    return out


def sample(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    rc = main(["sample", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# --- the choice rule -------------------------------------------------------------------------------


def test_greedy_is_the_first_argmax_and_ignores_the_draw() -> None:
    logits = np.array([0.5, 2.0, 2.0, -1.0])
    assert {choose(logits, 0.0, None, u) for u in (0.0, 0.5, 0.999)} == {1}


def test_the_inverse_cdf_at_a_known_draw() -> None:
    # softmax(log [1, 2, 3, 4]) = [0.1, 0.2, 0.3, 0.4]: CDF 0.1, 0.3, 0.6, 1.0
    logits = np.log([1.0, 2.0, 3.0, 4.0])
    assert [choose(logits, 1.0, None, u) for u in (0.05, 0.15, 0.35, 0.65, 0.9999)] == [0, 1, 2, 3, 3]
    # temperature 0.5 squares the weights: [1, 4, 9, 16] / 30, CDF 1/30, 5/30, 14/30, 1
    assert [choose(logits, 0.5, None, u) for u in (0.03, 0.1, 0.4, 0.5)] == [0, 1, 2, 3]


def test_top_k_keeps_the_k_largest_and_ties_at_the_kth() -> None:
    logits = np.log([1.0, 2.0, 3.0, 4.0])
    # top 2: weights [3, 4] / 7 on tokens 2 and 3
    assert [choose(logits, 1.0, 2, u) for u in (0.0, 0.42, 0.43, 0.99)] == [2, 2, 3, 3]
    tied = np.array([1.0, 3.0, 1.0, 2.0])  # k = 3: the k-th largest is 1.0, both 1.0s stay (nanoGPT's rule)
    kept = {choose(tied, 1.0, 3, u) for u in np.linspace(0.0, 0.999, 400)}
    assert kept == {0, 1, 2, 3}
    assert {choose(tied, 1.0, 1, u) for u in (0.0, 0.5, 0.99)} == {1}  # top 1 is greedy


# --- the command ---------------------------------------------------------------------------------------


def test_a_float64_run_samples_the_same_text_on_both_backends(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    opts = ["--prompt", "ROMEO:", "--tokens", "60", "--seed", "7", "--top-k", "20", "--temperature", "0.9"]
    texts = {}
    for backend in ("torch", "jax"):
        rc, out, err = sample(capsys, str(run_dir), *opts, "--backend", backend)
        assert rc == 0 and f"on {backend} in float64" in err
        texts[backend] = out
    assert texts["torch"] == texts["jax"]
    assert texts["torch"].startswith("ROMEO:") and len(texts["torch"]) == len("ROMEO:") + 60 + 1  # + newline
    _, other_seed, _ = sample(capsys, str(run_dir), *opts[:5], "8", *opts[6:])  # controls
    _, other_t, _ = sample(capsys, str(run_dir), *opts[:-1], "1.5")
    assert other_seed != texts["torch"] and other_t != texts["torch"]


def test_greedy_equals_transformers_generate_on_the_exported_model(run_dir: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    from conformance.data import DataPipeline
    from conformance.config import load_config

    assert main(["export", str(run_dir), "--to", "hf", "-o", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    prompt, n = "KING", 20  # within the model's 32 positions, as generate needs
    rc, out, _ = sample(capsys, str(run_dir), "--prompt", prompt, "--tokens", str(n), "--temperature", "0")
    assert rc == 0
    vocab = DataPipeline(load_config(CONFIG)).info.vocab
    ids = torch.tensor([[vocab.index(c) for c in prompt]])
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf", dtype=torch.float64).eval()
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)[0, len(prompt):]
    assert out == prompt + "".join(vocab[int(i)] for i in got) + "\n"


def test_refusals_are_one_line(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc, out, err = sample(capsys, str(run_dir), "--prompt", "ROMEO€", "--tokens", "5")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "'€' not in the run's vocabulary of 65" in err
    rc, _, err = sample(capsys, str(run_dir), "--tokens", "0")
    assert rc == 2 and "--tokens must be at least 1" in err
    rc, _, err = sample(capsys, str(tmp_path / "nothing"))
    assert rc == 2 and "no such run directory" in err
    blobs = tmp_path / "blobs"
    train({"model": {"name": "mlp", "hidden": [4]}, "data": {"name": "binary_blobs", "n_samples": 64, "batch_size": 16},
           "run": {"max_updates": 1, "eval_every": 0}}, blobs, progress="none")
    rc, _, err = sample(capsys, str(blobs))
    assert rc == 2 and "sample needs the built-in gpt" in err and err.count("\n") == 1


# --- token-shard runs: the tokenizer beside the shards, or --tokenizer ----------------------------------

WORDS = ["[UNK]", "the", "king", "queen", "rode", "to", "york", "and", "back", "."]


def token_run(tmp: Path, tokenizer: str) -> Path:
    """A float64 gpt trained on shards `twinstep data tokenize` wrote with `tokenizer` (a path or
    "bytes"), which leaves its tokenizer.json beside them."""
    from conformance.data.tokenize import tokenize

    (tmp / "a.txt").write_text("the king rode to york and back . the queen rode to york .\n" * 60)
    shards = tokenize([str(tmp / "a.txt")], tmp / "shards", tokenizer, progress=False)
    config = {**CONFIG, "model": {**CONFIG["model"], "block_size": 16, "vocab_size": shards.vocab_size},
              "data": {"name": "tokens", "path": f"{tmp}/shards/train_*.bin", "batch_size": 8},
              "run": {**CONFIG["run"], "max_updates": 20}}
    train(config, tmp / "run", progress="none")
    return tmp / "run"


def greedy_ids(run: Path, tmp: Path, prompt_ids: list[int], n: int) -> list[int]:
    """transformers' greedy generate on the run exported to Hugging Face: the reference."""
    transformers = pytest.importorskip("transformers")
    import torch

    assert main(["export", str(run), "--to", "hf", "-o", str(tmp / "hf")]) == 0
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp / "hf", dtype=torch.float64).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return [int(i) for i in out[0, len(prompt_ids):]]


def test_a_tokenizer_json_beside_the_shards_encodes_and_decodes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, "[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    run = token_run(tmp_path, str(tmp_path / "tokenizer.json"))
    prompt = "the queen rode"
    want = greedy_ids(run, tmp_path, tok.encode(prompt).ids, 8)
    capsys.readouterr()
    rc, out, err = sample(capsys, str(run), "--prompt", prompt, "--tokens", "8", "--temperature", "0")
    assert rc == 0 and out == prompt + tok.decode(want) + "\n", err
    (tmp_path / "shards" / "tokenizer.json").unlink()  # control: nothing beside the shards names the vocabulary
    rc, out, err = sample(capsys, str(run), "--prompt", prompt, "--tokens", "8", "--temperature", "0")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "the run's vocabulary is unknown: no tokenizer.json beside the run's token shards" in err
    assert "--tokenizer bytes or --tokenizer PATH/tokenizer.json" in err  # what to do instead
    rc, again, _ = sample(capsys, str(run), "--prompt", prompt, "--tokens", "8", "--temperature", "0",
                          "--tokenizer", str(tmp_path / "tokenizer.json"))
    assert rc == 0 and again == out + prompt + tok.decode(want) + "\n"


def test_a_byte_run_continues_a_multibyte_prompt(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = token_run(tmp_path, "bytes")
    prompt = "the qué"  # é is two bytes, two tokens; 8 + 6 within the model's 16 positions
    want = greedy_ids(run, tmp_path, list(prompt.encode()), 6)
    capsys.readouterr()
    rc, out, err = sample(capsys, str(run), "--prompt", prompt, "--tokens", "6", "--temperature", "0")
    assert rc == 0 and out == prompt + bytes(want).decode("utf-8", errors="replace") + "\n", err
