"""`twinstep drift`: the twins against a floor of rounding-sized self-runs (conformance/run/drift.py).

The nudges are one ulp exactly and drawn from the seed alone; the distance is the hand-computed
one; the float64 runs skip what the twins skipped and scale as they did; end to end, a planted
rounding-sized difference (the JAX lr one float32 ulp higher) stays
inside the envelope while the lr 1 % higher is far outside (negative control), and the command
writes its table, series and plot.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conformance.cli import main
from conformance.cli.drift_runs import Planned, chains, worker_threads
from conformance.config import load_config
from conformance.errors import TwinstepError
from conformance.run.drift import MULTIPLE, exact_overrides, measure, nudge_lr, nudge_weights, relative_distance

ROOT = Path(__file__).resolve().parents[1]
F32 = np.dtype(np.float32)
SMALL = ["--updates", "10", "--seeds", "1", "--set", "schedule.warmup_steps=2"]


def test_nudge_moves_about_half_the_entries_by_exactly_one_ulp() -> None:
    w = {"a": np.random.default_rng(0).normal(size=(100, 50)).astype(F32), "b": np.ones(7, F32)}
    out = nudge_weights(w, 1, F32)
    for name, x in w.items():
        y = out[name]
        assert y.dtype == F32
        up, down = np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))
        assert np.all((y == x) | (y == up) | (y == down))
    moved = np.mean(out["a"] != w["a"])
    assert 0.45 < moved < 0.55  # 5000 entries: half, within 7 standard deviations
    again = nudge_weights(w, 1, F32)
    assert all(np.array_equal(again[k], out[k]) for k in w)  # the seed alone decides
    other = nudge_weights(w, 2, F32)
    assert not np.array_equal(other["a"], out["a"])


def test_the_lr_moves_one_ulp_up_for_odd_seeds_and_down_for_even() -> None:
    lr = np.float32(3e-3)
    assert nudge_lr(3e-3, 1, F32) == float(np.nextafter(lr, np.float32(np.inf)))
    assert nudge_lr(3e-3, 2, F32) == float(np.nextafter(lr, np.float32(-np.inf)))
    assert nudge_lr(3e-3, 1, np.dtype(np.float64)) == np.nextafter(3e-3, np.inf)


def test_relative_distance_is_the_norm_of_the_difference_over_the_norm() -> None:
    a = {"w": np.array([3.0, 0.0]), "b": np.array([4.0])}
    b = {"w": np.array([3.0, 1.0]), "b": np.array([4.0])}
    assert relative_distance(a, b) == pytest.approx(1 / 5, rel=1e-15)  # ‖(0, 1, 0)‖ / ‖(3, 0, 4)‖
    assert relative_distance(a, a) == 0.0


@pytest.mark.parametrize("dtype, dynamic", [("float16", True), ("bfloat16", False)])
def test_the_float64_run_skips_and_scales_as_its_twin(dtype: str, dynamic: bool) -> None:
    config = load_config(ROOT / "configs" / "gpt_tiny.toml", [f'precision.dtype="{dtype}"', "precision.init_scale=1024.0"]
                         if dynamic else [f'precision.dtype="{dtype}"'])
    exact = load_config(ROOT / "configs" / "gpt_tiny.toml",
                        [f'precision.dtype="{dtype}"', *(["precision.init_scale=1024.0"] if dynamic else []),
                         "run.max_updates=10", *exact_overrides(config, [0, 3])])
    assert exact.precision.dtype == "float64" and exact.run.inject_nonfinite == [0, 3]
    assert exact.precision.dynamic_scaling is dynamic
    assert exact.precision.init_scale == (1024.0 if dynamic else 2.0**16)


def _plan(seeds: int) -> list[Planned]:
    return ([Planned(fw, fw, []) for fw in ("torch", "jax")]
            + [Planned(f"{fw}-seed{k}", fw, []) for k in range(1, seeds + 1) for fw in ("torch", "jax")]
            + [Planned(f"{fw}-exact", fw, [], exact_of=fw) for fw in ("torch", "jax")])


@pytest.mark.parametrize("jobs, expected", [
    (1, [["torch", "jax", "torch-seed1", "jax-seed1", "torch-seed2", "jax-seed2", "torch-exact", "jax-exact"]]),
    (2, [["jax", "jax-exact", "jax-seed1", "jax-seed2"], ["torch", "torch-exact", "torch-seed1", "torch-seed2"]]),
    (4, [["jax", "jax-exact"], ["jax-seed1", "jax-seed2"], ["torch", "torch-exact"], ["torch-seed1", "torch-seed2"]]),
    (16, [["jax", "jax-exact"], ["jax-seed1"], ["jax-seed2"], ["torch", "torch-exact"], ["torch-seed1"], ["torch-seed2"]]),
])
def test_each_chain_holds_one_framework_and_each_float64_run_follows_its_twin(jobs: int, expected: list) -> None:
    got = chains(_plan(2), jobs)
    assert [[p.name for p in chain] for chain in got] == expected
    assert sorted(p.name for chain in got for p in chain) == sorted(p.name for p in _plan(2))  # every run once


@pytest.mark.parametrize("cores, workers, threads", [(2, 2, 1), (16, 2, 8), (16, 6, 2), (2, 6, 1), (4, 1, 4)])
def test_each_worker_gets_its_share_of_the_cores(cores: int, workers: int, threads: int) -> None:
    assert worker_threads(cores, workers) == threads


def test_a_run_that_fails_stops_the_drift_naming_it_and_its_log(tmp_path: Path, capsys) -> None:
    out = tmp_path / "d"
    rc = main(["drift", str(ROOT / "configs" / "gpt_tiny.toml"), *SMALL, "--torch-set", 'precision.on_nonfinite="raise"',
               "--torch-set", "run.inject_nonfinite=[2]", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "drift run torch failed (exit 2)" in err and f"(log: {out / 'runs' / 'torch.log'})" in err
    assert not (out / "drift.json").exists()


def _drift(tmp_path: Path, name: str, *extra: str, capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    out = tmp_path / name
    rc = main(["drift", str(ROOT / "configs" / "gpt_tiny.toml"), *SMALL, *extra, "-o", str(out)])
    return rc, json.loads((out / "drift.json").read_text()), capsys.readouterr().out


def test_a_rounding_sized_lr_difference_is_inside_and_one_percent_is_outside(tmp_path: Path, capsys) -> None:
    lr = 3e-3
    ulp = nudge_lr(lr, 1, F32)
    rc, doc, text = _drift(tmp_path, "ulp", "--jax-set", f"optimizer.lr={ulp!r}", capsys=capsys)
    assert rc == 0 and doc["inside"] and doc["worst_ratio"] <= MULTIPLE
    assert "inside the envelope" in text and (tmp_path / "ulp" / "drift.png").stat().st_size > 0
    assert doc["saved_updates"] == list(range(1, 11))
    assert set(doc["selves"]) == {"torch-seed1", "jax-seed1"} and set(doc["exact"]) == {"torch", "jax"}
    assert doc["floor"] == [max(a, b, r) for a, b, r in zip(*doc["selves"].values(), doc["rounding"])]
    # rounding-sized, and not zero: the twins do differ (after update 1 they are equal: warm-up's lr is 0);
    # measured 8.3e-7 after 10 updates, the self-runs 8.6e-7: 1e-5 is an order of magnitude above both
    assert max(doc["twins"]) > 0 and all(d < 1e-5 for d in doc["twins"])
    # the envelope reads run directories only: the same runs under another pair's names measure the same
    runs = tmp_path / "ulp" / "runs"
    pair = measure({"mine": runs / "torch", "theirs": runs / "jax"},
                   {"mine": [runs / "torch-seed1"], "theirs": [runs / "jax-seed1"]},
                   {"mine": runs / "torch-exact", "theirs": runs / "jax-exact"})
    assert pair.twins == doc["twins"] and pair.floor == doc["floor"]
    assert set(pair.selves) == {"mine-seed1", "theirs-seed1"}
    with pytest.raises(TwinstepError, match="compares two twins; received 1"):
        measure({"mine": runs / "torch"}, {"mine": [runs / "torch-seed1"]})
    rc, doc, text = _drift(tmp_path, "lr", "--jax-set", f"optimizer.lr={lr * 1.01!r}", capsys=capsys)
    assert rc == 1 and not doc["inside"] and doc["worst_ratio"] > 100 * MULTIPLE  # measured 3,730
    assert "OUTSIDE the envelope" in text


def test_an_output_directory_in_use_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    rc = main(["drift", str(ROOT / "configs" / "gpt_tiny.toml"), *SMALL, "-o", str(tmp_path)])
    assert rc == 2
    assert "is not an empty directory; choose another -o" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"
