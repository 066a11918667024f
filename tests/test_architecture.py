"""The architecture's import rules and file-size rule (docs/architecture.md, "Import rules").

Every module under conformance/, ref_torch/ and ref_jax/ is parsed with `ast` (nothing is imported),
and every import it can execute is collected: module-level ones, those inside functions (lazy
imports), relative ones resolved, and `importlib.import_module("literal")` / `__import__("literal")`.
Each rule is a function of that import graph, and each has a negative control: the same checker run
on a small synthetic package that breaks the rule must flag it (and must not flag a clean module).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("conformance", "ref_torch", "ref_jax", "natives")
SOURCE_DIRS = ("conformance", "ref_torch", "ref_jax", "natives", "tests", "tools", "bench")
MAX_LINES = 400

FRAMEWORKS = ("torch", "jax", "jaxlib", "optax", "flax", "keras")
# conformance's framework-free rooms (conformance.run.metrics writes TensorBoard with the
# `tensorboard` package itself, which is not a framework).
NEUTRAL = (
    "conformance.errors", "conformance.tomlio", "conformance.rules.models", "conformance.config",
    "conformance.rules", "conformance.oracle", "conformance.data", "conformance.checkpoint",
    "conformance.run", "conformance.harness", "conformance.export",
)
# What the oracle may import besides the standard library: it is written from the equations.
# ml_dtypes is NumPy's bfloat16 (the oracle rounds Muon's Newton–Schulz as torch does), no framework.
ORACLE_MAY_IMPORT = ("conformance.oracle", "conformance.config", "conformance.rules", "conformance.errors",
                     "numpy", "ml_dtypes")


class Import(NamedTuple):
    module: str  # the importing module, e.g. "conformance.run.metrics"
    target: str  # what it imports, e.g. "torch.utils.tensorboard"
    line: int

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of `from <level dots><name> import ...` inside `module`."""
    if level == 0:
        return name or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _literal_import(node: ast.Call) -> str | None:
    """`importlib.import_module("x")` / `import_module("x")` / `__import__("x")` with a literal name."""
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if called in ("import_module", "__import__") and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
            return arg.value
    return None


def module_imports(path: Path, root: Path) -> list[Import]:
    """Every import of one source file, lazy ones included (`from a import b` yields a and a.b)."""
    module, is_package = _module_name(path, root)
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            found.append(Import(module, base, node.lineno))
            found += [Import(module, f"{base}.{a.name}", node.lineno) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and (target := _literal_import(node)):
            found.append(Import(module, target, node.lineno))
    return found


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> list[Import]:
    """The imports of every module of `packages` under `root`."""
    return [imp for pkg in packages for path in sorted((root / pkg).rglob("*.py"))
            for imp in module_imports(path, root)]


def within(name: str, prefixes: Iterable[str]) -> bool:
    """`name` is one of `prefixes` or a submodule of one."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def is_private_twin(name: str) -> bool:
    """A private module of a twin (`ref_torch._update`), or anything inside one."""
    parts = name.split(".")
    return (parts[0] in ("ref_torch", "ref_jax") and len(parts) > 1 and parts[1].startswith("_")
            and not parts[1].startswith("__"))


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name == "__future__"


class Rule(NamedTuple):
    """Modules within `applies_to` must not import anything `forbidden` says, except the known
    offenders: (module, target prefix) pairs still being fixed, each checked by its own strict xfail."""

    name: str
    applies_to: tuple[str, ...]
    forbidden: Callable[[str], bool]
    known: tuple[tuple[str, str], ...] = ()


TRACES = "conformance.port.verify.traces"
RULES = [
    Rule("ref_torch imports no JAX", ("ref_torch",), lambda t: within(t, ("jax", "jaxlib", "optax", "flax"))),
    Rule("ref_jax imports no torch", ("ref_jax",), lambda t: within(t, ("torch",))),
    Rule("no twin imports the oracle", ("ref_torch", "ref_jax"), lambda t: within(t, ("conformance.oracle",))),
    Rule("neutral conformance imports no framework", NEUTRAL, lambda t: within(t, FRAMEWORKS)),
    Rule("conformance imports no private twin module", ("conformance",), is_private_twin),
    Rule("the oracle imports only config, rules, errors, numpy and the standard library",
         ("conformance.oracle",), lambda t: not (within(t, ORACLE_MAY_IMPORT) or is_stdlib(t))),
    Rule("rules import no oracle, twin or harness", ("conformance.rules",),
         lambda t: within(t, ("conformance.oracle", "conformance.harness", "ref_torch", "ref_jax"))),
    # export writes files from neutral tensors; the frameworks only read its output (tests/test_export.py)
    Rule("export imports no twin, oracle or harness", ("conformance.export",),
         lambda t: within(t, ("ref_torch", "ref_jax", "conformance.oracle", "conformance.harness", "transformers"))),
]
# The native backends (natives/) run the frameworks' own built-ins: from conformance they may use the spec,
# the errors and only these host-side input checks and group resolution of conformance.rules, never
# twinstep's mathematics (the twins, the oracle, the port snippets, the harness).
NATIVE_RULES = ("conformance.rules.inputs.check_loss_inputs", "conformance.rules.groups.resolve_groups",
                "conformance.rules.groups.group_base_lrs", "conformance.rules.groups.ParamGroup",
                "conformance.rules.schedules.hyper_bases",  # each group's base value of a [schedule.hyper] key
                "conformance.rules.trajectory.check_trajectory_inputs", "conformance.rules.state.check_state",
                "conformance.rules.schedules.check_schedule", "conformance.rules.schedules.check_metrics",
                "conformance.rules.schedules.spots", "conformance.rules.windows.prepare_windows",
                "conformance.rules.loss_scale.require_dynamic_scaling")
NATIVE_RULE_MODULES = tuple(dict.fromkeys(n.rsplit(".", 1)[0] for n in NATIVE_RULES))


def _native_rules_forbid(t: str) -> bool:
    return within(t, ("conformance.rules",)) and t not in NATIVE_RULES and t not in NATIVE_RULE_MODULES


RULES += [
    Rule("natives use no twin, oracle, port, harness or run code", ("natives",),
         lambda t: within(t, ("ref_torch", "ref_jax", "conformance.oracle", "conformance.port", "conformance.harness",
                              "conformance.cli", "conformance.run", "conformance.data", "conformance.checkpoint"))),
    Rule("natives use only input checks and group resolution from conformance.rules", ("natives",),
         _native_rules_forbid),
    Rule("torch-native imports no JAX or Keras", ("natives.torch_native",),
         lambda t: within(t, ("jax", "jaxlib", "optax", "flax", "keras"))),
    Rule("optax-native imports no torch or Keras", ("natives.optax_native",), lambda t: within(t, ("torch", "keras"))),
    Rule("the keras backend imports no torch or optax", ("natives.keras_backend",),
         lambda t: within(t, ("torch", "optax", "flax"))),
    Rule("natives' shared protocol imports no framework", ("natives._protocol",), lambda t: within(t, FRAMEWORKS)),
    Rule("conformance imports no native backend", ("conformance",), lambda t: within(t, ("natives",))),
]
RULE = {rule.name: rule for rule in RULES}
KNOWN = [(rule, pair) for rule in RULES for pair in rule.known]


def _known(rule: Rule, imp: Import) -> bool:
    return any(within(imp.module, (m,)) and within(imp.target, (t,)) for m, t in rule.known)


def offenders(rule: Rule, graph: list[Import], known: bool = False) -> list[str]:
    """The imports in `graph` that break `rule`, as 'module:line imports target': the unknown ones,
    or with `known` only those of the rule's known offenders."""
    return sorted({str(i) for i in graph
                   if within(i.module, rule.applies_to) and rule.forbidden(i.target) and _known(rule, i) == known})


def private_names(root: Path, graph: list[Import]) -> list[str]:
    """Imports of another module's private name (`from ref_torch.clipping import _scale_by_norm`):
    a target in PACKAGES whose last part is private (one underscore) and is not itself a module; a
    private module (`from ref_torch import _fsdp`) is a module's own business to import."""
    found = []
    for imp in graph:
        last = imp.target.rpartition(".")[2]
        path = root / imp.target.replace(".", "/")
        if (within(imp.target, PACKAGES) and last.startswith("_") and not last.startswith("__")
                and not path.with_suffix(".py").exists() and not path.is_dir()):
            found.append(str(imp))
    return sorted(found)


def long_files(root: Path, dirs: Iterable[str] = SOURCE_DIRS, limit: int = MAX_LINES) -> list[str]:
    """Source files over `limit` lines, as 'path: N lines'."""
    return [f"{p.relative_to(root)}: {n} lines" for d in dirs for p in sorted((root / d).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    return import_graph(ROOT)


def test_the_scan_sees_lazy_and_relative_imports(graph: list[Import]) -> None:
    """Guards the guard: known imports of the real tree are found, lazy and module-level alike."""
    targets = {(i.module, i.target) for i in graph}
    assert ("ref_torch.trainer", "conformance.events") in targets
    assert ("conformance.port.read.torch_optim", "torch") in targets  # imported inside a function
    assert len({i.module for i in graph}) > 100


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_import_rule(rule: Rule, graph: list[Import]) -> None:
    bad = offenders(rule, graph)
    assert not bad, f"{rule.name}: " + "; ".join(bad)


@pytest.mark.xfail(strict=True, reason="a known offender, being fixed: remove it from Rule.known when it passes")
@pytest.mark.parametrize(("rule", "pair"), KNOWN, ids=lambda x: x.name if isinstance(x, Rule) else " -> ".join(x))
def test_known_offender_is_gone(rule: Rule, pair: tuple[str, str], graph: list[Import]) -> None:
    bad = offenders(rule._replace(known=(pair,)), graph, known=True)
    assert not bad, "; ".join(bad)


def test_no_module_imports_another_modules_private_name(graph: list[Import]) -> None:
    assert private_names(ROOT, graph) == []


def test_negative_control_private_name(tmp_path: Path) -> None:
    _write(tmp_path, {**CLEAN, "ref_torch/clipping.py": "def _scale_by_norm():\n    pass\n",
                      "ref_torch/_fsdp.py": "", "ref_jax/_update.py": "", "ref_torch/_update.py":
                      "from ref_torch import _fsdp\nfrom ref_torch.clipping import _scale_by_norm\n"})
    assert private_names(tmp_path, import_graph(tmp_path)) == [
        "ref_torch._update:2 imports ref_torch.clipping._scale_by_norm"]


def test_no_source_file_over_400_lines() -> None:
    assert not long_files(ROOT), "; ".join(long_files(ROOT))


# The same rule at run time: writing TensorBoard scalars (conformance.run.metrics) loads no framework.
TB_PROBE = """
import sys, tempfile
{before}
from conformance.run.metrics import MetricsLog
with tempfile.TemporaryDirectory() as d, MetricsLog(d, 1, progress="none", loggers=["tensorboard"]) as log:
    log.log_update({{"update": 0, "loss": 1.0, "lr": [0.1]}})
print(" ".join(sorted({{m.split(".")[0] for m in sys.modules}} & {frameworks})))
"""


def _frameworks_loaded(before: str = "") -> str:
    code = TB_PROBE.format(before=before, frameworks=set(FRAMEWORKS))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out.stdout.strip()


def test_tensorboard_metrics_load_no_framework() -> None:
    pytest.importorskip("tensorboard")
    assert _frameworks_loaded() == ""
    assert _frameworks_loaded("import torch.utils.tensorboard") == "torch"  # negative control: the probe sees it


# Negative controls: each rule must flag a synthetic package that breaks it, lazily or not.

def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


BREAKS = {
    "ref_torch imports no JAX": ("ref_torch/bad.py", "def f():\n    import jax.numpy as jnp\n"),
    "ref_jax imports no torch": ("ref_jax/bad.py", "from torch import nn\n"),
    "no twin imports the oracle": ("ref_jax/bad.py", "def f():\n    from conformance.oracle import losses\n"),
    "neutral conformance imports no framework": (
        "conformance/run/bad.py", "def f():\n    from torch.utils.tensorboard import SummaryWriter\n"),
    "conformance imports no private twin module": (
        "conformance/harness/bad.py", "def f():\n    from ref_torch import _update\n"),
    "the oracle imports only config, rules, errors, numpy and the standard library": (
        "conformance/oracle/bad.py", "from ..harness import compare\nimport scipy.special\n"),
    "rules import no oracle, twin or harness": (
        "conformance/rules/bad.py", "from ..oracle.losses import elementwise\n"),
    "export imports no twin, oracle or harness": (
        "conformance/export/bad.py", "def f():\n    from ref_jax import models\n    import transformers\n"),
    "natives use no twin, oracle, port, harness or run code": (
        "natives/optax_native/bad.py", "def f():\n    from conformance.oracle.optimizers import update\n"),
    "natives use only input checks and group resolution from conformance.rules": (
        "natives/torch_native/bad.py", "from conformance.rules.inputs import valid_count\n"),
    "torch-native imports no JAX or Keras": ("natives/torch_native/bad.py", "def f():\n    import optax\n"),
    "optax-native imports no torch or Keras": ("natives/optax_native/bad.py", "import torch.nn.functional as F\n"),
    "the keras backend imports no torch or optax": ("natives/keras_backend/bad.py", "def f():\n    import optax\n"),
    "natives' shared protocol imports no framework": ("natives/_protocol.py", "def f():\n    import jax\n"),
    "conformance imports no native backend": (
        "conformance/harness/bad.py", "def f():\n    import natives.torch_native.losses\n"),
}
CLEAN = {
    "conformance/__init__.py": "",
    "conformance/oracle/__init__.py": "",
    "conformance/oracle/good.py": "import math\nimport numpy as np\nfrom . import other\n"
                                  "from ..rules.tolerance import loosest\nfrom conformance.errors import InputError\n",
    "conformance/rules/__init__.py": "",
    "conformance/rules/good.py": "from conformance.config import Config\n",
    "conformance/run/__init__.py": "",
    "conformance/run/good.py": "def f():\n    from tensorboard.compat.proto.event_pb2 import Event\n",
    "conformance/export/__init__.py": "",
    "conformance/export/good.py": "import json\nimport safetensors.numpy\nfrom conformance.checkpoint import load_checkpoint\n",
    "conformance/harness/__init__.py": "",
    "conformance/harness/good.py": "import importlib\nfrom ref_torch import losses\n",
    "ref_torch/__init__.py": "",
    "ref_torch/good.py": "import torch\nfrom . import _update\nfrom conformance.rules import inputs\n",
    "ref_jax/__init__.py": "",
    "ref_jax/good.py": "import jax\nimport optax\nfrom ._update import make_update_step\n",
    "natives/__init__.py": "",
    "natives/_protocol.py": "import numpy as np\nfrom conformance.errors import UnsupportedError\n",
    "natives/torch_native/__init__.py": "",
    "natives/torch_native/good.py": "import torch\nfrom conformance.rules.inputs import check_loss_inputs\n"
                                    "from conformance.rules.groups import resolve_groups\nfrom natives._protocol import refuse\n",
    "natives/optax_native/__init__.py": "",
    "natives/optax_native/good.py": "import jax\nimport optax\nfrom conformance.config import LossSpec\n",
    "natives/keras_backend/__init__.py": "",
    "natives/keras_backend/good.py": "def f():\n    import keras\n    import jax\n",
}


def test_every_rule_has_a_break() -> None:
    assert set(BREAKS) == {r.name for r in RULES}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_negative_control(rule: Rule, tmp_path: Path) -> None:
    _write(tmp_path, CLEAN)
    assert offenders(rule, import_graph(tmp_path)) == [], "the clean synthetic package must pass"
    path, text = BREAKS[rule.name]
    _write(tmp_path, {path: text})
    bad = offenders(rule, import_graph(tmp_path))
    module = path.removesuffix(".py").replace("/", ".")
    assert bad and all(b.startswith(module + ":") for b in bad), bad


def test_negative_control_known_offenders(tmp_path: Path) -> None:
    """A known offender is reported apart (and only its own target prefix); a new one is not hidden."""
    rule = RULE["conformance imports no private twin module"]._replace(known=((TRACES, "ref_jax"),))
    _write(tmp_path, {**CLEAN, "conformance/port/verify/traces.py": "def f():\n    import ref_jax._update as u\n"})
    assert offenders(rule, import_graph(tmp_path)) == []
    assert offenders(rule, import_graph(tmp_path), known=True) == [f"{TRACES}:2 imports ref_jax._update"]
    _write(tmp_path, {"conformance/port/verify/native.py": "from ref_jax import _update\n"})
    assert offenders(rule, import_graph(tmp_path)) == ["conformance.port.verify.native:1 imports ref_jax._update"]
    oracle = RULE["the oracle imports only config, rules, errors, numpy and the standard library"]
    _write(tmp_path, {"conformance/oracle/models.py":
                      "from conformance.rules.models import check_model_input\nimport torch\n"})
    assert offenders(oracle, import_graph(tmp_path)) == ["conformance.oracle.models:2 imports torch"]


def test_negative_control_literal_dynamic_import(tmp_path: Path) -> None:
    _write(tmp_path, {**CLEAN, "conformance/data/bad.py": "import importlib\nimportlib.import_module('jax')\n"})
    rule = RULE["neutral conformance imports no framework"]
    assert offenders(rule, import_graph(tmp_path)) == ["conformance.data.bad:2 imports jax"]


def test_negative_control_long_file(tmp_path: Path) -> None:
    _write(tmp_path, {"tools/short.py": "x = 1\n" * MAX_LINES, "tools/long.py": "x = 1\n" * (MAX_LINES + 1)})
    assert long_files(tmp_path) == [f"tools/long.py: {MAX_LINES + 1} lines"]

