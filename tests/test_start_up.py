"""What a torch training process imports: ml_dtypes only when a tensor is bfloat16.

ml_dtypes (NumPy's bfloat16) costs a process ~0.7 s to import on a 2-core machine (python -X
importtime; a tiny torch run takes 3.4 s instead of 4.3 s without it). A float32 run, checkpoints
included, never needs it; the suite starts hundreds of such processes, and users' CLI runs pay it
on every start. (torch.optim's first param group imports torch._dynamo, ~0.8 s more, torch's own.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.processes import child_env

HEAVY = ("ml_dtypes",)

RUN = """
import json, sys
from conformance.config import load_config
from ref_torch.trainer import train
config = load_config({{"model": {{"name": "mlp", "hidden": [4]}}, "data": {{"name": "binary_blobs", "batch_size": 8}},
                      "run": {{"max_updates": 2, "progress": "none"}}, "checkpoint": {{"every": 1, "at_end": True}}}})
train(config, sys.argv[1])
{after}
print(json.dumps({{name: name in sys.modules for name in {heavy!r}}}))
"""


# the control: a bfloat16 tensor read from safetensors bytes needs ml_dtypes, imported then
READ_BFLOAT16 = """
import safetensors.torch, torch
from conformance.checkpoint.files import decode_tensors
data = safetensors.torch.save({"w": torch.ones(2, dtype=torch.bfloat16)})
if decode_tensors(data, "w.safetensors")["w"].dtype.name != "bfloat16":
    raise SystemExit("not read as bfloat16")
"""


def imported(tmp: Path, after: str = "") -> dict[str, bool]:
    code = RUN.format(after=after, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code, str(tmp / "run")], env=child_env(), capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_float32_run_with_checkpoints_does_not_import_ml_dtypes(tmp_path: Path) -> None:
    assert imported(tmp_path) == {name: False for name in HEAVY}


def test_negative_control_reading_a_bfloat16_tensor_imports_ml_dtypes(tmp_path: Path) -> None:
    assert imported(tmp_path, READ_BFLOAT16) == {"ml_dtypes": True}
