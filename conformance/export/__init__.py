"""Export a run's weights for other code (`twinstep export`; docs/export.md).

- `source`: the checkpoint to export (a run's newest verified one, or a named one), its model spec
  and its weights (the model's, or the EMA's);
- `names`: the built-in models' names in torch's state_dict and in ref_jax's NNX parameter tree;
- `hf`: the bundled gpt as a Hugging Face GPT-2 (names, Conv1D layout, config.json);
- `vocab`: the run's vocabulary (characters or bytes) as a tokenizer.json transformers loads;
- `write`: an export directory written atomically (a temp directory renamed into place);
- `exporter`: `export(...)`, all of the above for one `--to` format.

Framework-free: every file is written with NumPy and safetensors; torch, JAX and transformers
only read the result (tests/test_export.py).
"""

from __future__ import annotations

from conformance.export.exporter import FORMATS, ExportResult, export

__all__ = ["FORMATS", "ExportResult", "export"]
