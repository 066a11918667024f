"""Case files are strict and complete: every table is read by its kind or refused
naming the file and the table; optimizer cases with [schedule] / [clip] keep to what the update path
can run; a malformed file is one failed result (file, key, reason) and the other files still run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.errors import CaseError
from conformance.harness.case import (
    KINDS,
    collect_cases,
    kind_module,
    load_case,
    used_sections,
)

LOSS = """id = "loss/tiny-mse"
kind = "loss"
source = "hand calculation: (1 + 16) / 2 = 8.5"
[loss]
name = "mse"
[inputs]
prediction = [2.0, 5.0]
target = [3.0, 1.0]
[expected]
value = 8.5
"""
SGD = """id = "optimizer/tiny-sgd"
kind = "optimizer"
source = "hand calculation: 1 - 0.1 * 2 = 0.8, then 0.8 - 0.1 * 1 = 0.7"
[optimizer]
name = "sgd"
lr = 0.1
[inputs]
params = { w = [1.0] }
grads = [ { w = [2.0] }, { w = [1.0] } ]
[expected]
params = [ { w = [0.8] }, { w = [0.7] } ]
"""
STEP = '[schedule]\nname = "step"\nstep_size = 1\ngamma = 0.5\n'  # update 1 applies lr 0.05: 0.8 - 0.05 = 0.75


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_loss_case_with_a_schedule_table_is_refused_naming_the_file_and_the_table(tmp_path) -> None:
    load_case(write(tmp_path, "clean.toml", LOSS))  # negative control: the same file without the table loads
    path = write(tmp_path, "bad.toml", LOSS + STEP)
    with pytest.raises(CaseError) as info:
        load_case(path)
    message = str(info.value)
    assert message.startswith(f"{path}: [schedule] is not read by kind = 'loss' (it reads [loss])")
    assert "\n" not in message


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "train"])
def test_every_kind_declares_the_tables_it_reads(kind: str) -> None:
    used = used_sections(kind_module(kind), kind)
    assert used and set(kind_module(kind).REQUIRED_SECTIONS) <= set(used)
    assert "precision" not in used or kind == "loss_scale"


def test_an_optimizer_case_reads_schedule_and_clip(tmp_path) -> None:
    case = load_case(write(tmp_path, "ok.toml", SGD.replace("[0.7]", "[0.75]") + STEP + "[clip]\nmax_norm = 10.0\n"))
    assert set(case.sections) == {"optimizer", "schedule", "clip"}
    with pytest.raises(CaseError, match=r"\[loss\] is not read by kind = 'optimizer'"):
        load_case(write(tmp_path, "bad.toml", SGD + '[loss]\nname = "mse"\n'))


@pytest.mark.parametrize(("edit", "words"), [
    (lambda t: t.replace("grads = [ { w = [2.0] }, { w = [1.0] } ]",
                         "objective = { center = { w = [0.0] }, curvature = { w = [1.0] } }\nsteps = 2"),
     "inputs.objective cannot be used with [schedule]"),
    (lambda t: t.replace("params = { w = [1.0] }", "params = { w = [1.0], b = [0.0] }")
                .replace("{ w = [2.0] }, { w = [1.0] }", "{ w = [2.0], b = [1.0] }, { w = [1.0] }")
                .replace("{ w = [0.8] }, { w = [0.7] }", "{ w = [0.8] }, { w = [0.75] }"),
     "inputs.grads[1] has no gradient for b"),
    (lambda t: t.replace("[expected]", "state = { w = { step = 3 } }\n[expected]"), "inputs.state cannot be used"),
    (lambda t: t.replace('kind = "optimizer"', 'kind = "optimizer"\ndtype = "bfloat16"'), "dtype = 'bfloat16'"),
])
def test_update_path_cases_are_refused_where_the_update_path_cannot_run_them(tmp_path, edit, words) -> None:
    with pytest.raises(CaseError, match=f"^{tmp_path}/bad.toml: .*" + words.replace("[", r"\[").replace("]", r"\]")):
        load_case(write(tmp_path, "bad.toml", edit(SGD) + STEP))


def test_a_broken_file_is_one_result_and_the_others_still_run(tmp_path, capsys) -> None:
    write(tmp_path, "good.toml", LOSS)
    write(tmp_path, "syntax.toml", "id = \n")
    write(tmp_path, "table.toml", LOSS.replace("tiny-mse", "tiny-mse-2") + STEP)
    write(tmp_path, "value.toml", SGD.replace("lr = 0.1", "lr = -0.1"))
    write(tmp_path, "z-again.toml", LOSS)  # the same id as good.toml
    cases, broken = collect_cases([tmp_path])
    assert [c.id for c in cases] == ["loss/tiny-mse"]
    got = {b.path.name: (b.key, b.id) for b in broken}
    assert got == {"syntax.toml": ("(file)", None), "table.toml": ("[schedule]", "loss/tiny-mse-2"),
                   "value.toml": ("optimizer.lr", "optimizer/tiny-sgd"), "z-again.toml": ("id", "loss/tiny-mse")}
    assert all(b.reason and str(b.path) in b.message for b in broken)

    out = tmp_path / "report.json"
    assert main(["conform", "--cases", str(tmp_path), "--backend", "oracle", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    good = [r for r in report["results"] if r["status"] == "passed"]
    assert [(r["case"], r["backend"]) for r in good] == [("loss/tiny-mse", "oracle")]
    failed = {Path(r["file"]).name: r for r in report["results"] if r["status"] == "failed"}
    assert set(failed) == {"syntax.toml", "table.toml", "value.toml", "z-again.toml"}
    assert failed["table.toml"]["key"] == "[schedule]" and "is not read by kind" in failed["table.toml"]["reason"]
    assert report["summary"] == {"passed": 1, "failed": 4, "unsupported": 0}
    shown = capsys.readouterr().out
    assert "table.toml: [schedule] is not read" in shown and "4 case file(s) could not be loaded" in shown


def test_only_keeps_broken_files_whose_id_matches_or_is_unreadable(tmp_path) -> None:
    write(tmp_path, "good.toml", LOSS)
    write(tmp_path, "value.toml", SGD.replace("lr = 0.1", "lr = -0.1"))
    write(tmp_path, "syntax.toml", "id = \n")
    cases, broken = collect_cases([tmp_path], only=["loss/*"])
    assert [c.id for c in cases] == ["loss/tiny-mse"]
    assert [b.path.name for b in broken] == ["syntax.toml"]


def test_load_cases_still_raises_for_the_first_broken_file(tmp_path) -> None:
    from conformance.harness.case import load_cases

    write(tmp_path, "good.toml", LOSS)
    write(tmp_path, "table.toml", LOSS.replace("tiny-mse", "x") + STEP)
    with pytest.raises(CaseError, match=r"table.toml: \[schedule\] is not read"):
        load_cases([tmp_path])
