"""Training metrics: `metrics.jsonl` (docs/contract.md §5), progress display, optional TensorBoard.

Both trainers write the same records through `MetricsLog`, so `twinstep compare` can diff a torch
run against a JAX run line by line. Every update writes

    {"event": "update", "update", "epoch", "samples_seen", "loss", "lr" (one per param group),
     "grad_norm" (before clipping), "loss_scale" (null when unscaled), "skipped",
     "data_time_s", "compute_time_s", "samples_per_s", ...extras}

and every evaluation `{"event": "eval", "update", "val_loss", ...metrics}`. A resumed run first cuts
the file back to the records before the checkpoint it resumes from, so the continued file equals
the uninterrupted run's.

Lines are written whole: update lines are encoded and written in batches (one `write` of complete
lines to a file opened with O_APPEND) at least every FLUSH_SECONDS, and always before an eval line,
at every checkpoint (`sync()`, which also fsyncs the file) and at `close()` (also when a run fails
or is preempted). A kill leaves whole lines, at worst without the last second's updates (which a
resume rewrites: it continues from a checkpoint, where the file was synced) or with an unfinished
last line (which read_metrics skips and a resume cuts away). Batching keeps the per-update cost at
a list append: encoding one line between two updates costs several times what it costs in a batch.
A metrics.jsonl that is a directory, a FIFO or a link, and any OSError while writing (a full disk),
is one PathError line naming the file.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from conformance.errors import PathError, TwinstepError
from conformance.files import check_entry, path_error, read_regular, write_text_atomic
from conformance.run.loggers import Loggers, eval_scalars, update_scalars

MAX_METRICS_BYTES = 1 << 32  # 4 GiB: millions of updates; more is not a metrics file of ours
FLUSH_SECONDS = 1.0  # buffered update lines reach the file at least this often
FLUSH_LINES = 1024  # ... and whenever this many are waiting

UPDATE_KEYS: tuple[str, ...] = (
    "event", "update", "epoch", "samples_seen", "loss", "lr", "grad_norm", "loss_scale", "skipped",
    "data_time_s", "compute_time_s", "samples_per_s",
)
EVAL_KEYS: tuple[str, ...] = ("event", "update", "val_loss")


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/Inf become the strings "nan"/"inf"/"-inf" (strict JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


_STRICT = json.JSONEncoder(allow_nan=False)  # raises on NaN/inf: then _clean spells them


def _dumps(record: Mapping[str, Any]) -> str:
    try:
        return _STRICT.encode(record)
    except ValueError:
        return json.dumps(_clean(record))


def _number(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl, with "nan"/"inf" turned back into floats."""
    records = []
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise TwinstepError(f"{path}: no such metrics file")
    raw = read_regular(path, MAX_METRICS_BYTES, what="metrics file")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise TwinstepError(f"{path}: not UTF-8 text") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):  # a torn last line from a killed run is not data
                break
            raise TwinstepError(f"{path}:{i}: not a JSON object") from None
        records.append({k: (_number(v) if not isinstance(v, list) else [_number(x) for x in v])
                        for k, v in rec.items()})
    return records


def updates(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == "update"]


def evals(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == "eval"]


class MetricsLog:
    """Append-only metrics.jsonl writer (one write per whole line) with a progress view.

    `resume_from=u` keeps only records of updates < u (an interrupted run may have logged updates
    it never checkpointed); `progress` is "auto" (a bar on a terminal, plain lines otherwise),
    "bar", "lines" or "none"; `loggers` are the trackers that get the same scalars
    (conformance.run.loggers: tensorboard, wandb, mlflow), `config` their run parameters.
    """

    def __init__(self, out_dir: str | Path, total_updates: int, resume_from: int | None = None,
                 progress: str = "auto", loggers: list[str] | None = None, log_every: int | None = None,
                 stream: TextIO | None = None, config: Mapping[str, Any] | None = None) -> None:
        self.path = Path(out_dir) / "metrics.jsonl"
        self.total = total_updates
        # unset: about 20 progress lines per run; metrics.jsonl has every update either way
        self.log_every = max(1, log_every if log_every is not None else total_updates // 20)
        self.stream = stream or sys.stderr
        try:
            exists = check_entry(self.path, "file")
            if resume_from is not None and exists:
                self._truncate(resume_from)
            elif resume_from is None and exists:
                self.path.unlink()
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
            self._fd: int | None = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise path_error(self.path, exc, "open for writing") from None
        mode = progress
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total_updates, initial=resume_from or 0, file=self.stream,
                             dynamic_ncols=True, unit="upd")
        self._mode = mode
        self._trackers = Loggers(Path(out_dir), list(loggers or []), config or {})
        self._pending: list[Mapping[str, Any]] = []  # update records not yet written
        self._rates: list[tuple[float, float | None, float | None]] = []  # since the last progress line
        self._started = False  # this process's first update (compilation, warm-up) is not a speed
        self._flushed_at = time.monotonic()

    def _truncate(self, before: int) -> None:
        keep = [r for r in read_metrics(self.path) if r.get("update", 0) < before]
        write_text_atomic(self.path, "".join(json.dumps(_clean(r)) + "\n" for r in keep))

    def _write(self, rec: Mapping[str, Any]) -> None:
        self._write_lines(_dumps(rec) + "\n")

    def _write_lines(self, text: str) -> None:
        line = text.encode("utf-8")
        if self._fd is None:
            raise PathError(f"{self.path}: the metrics log is closed")
        try:
            done = os.write(self._fd, line)  # one write of the whole line (O_APPEND)
            while done < len(line):  # only a full disk or a signal writes less: finish or fail
                done += os.write(self._fd, line[done:])
        except OSError as exc:
            raise path_error(self.path, exc, "write") from None

    def flush(self) -> None:
        """Write the buffered update lines now (one write of whole lines)."""
        pending, self._pending = self._pending, []
        self._flushed_at = time.monotonic()
        if pending:
            self._write_lines("".join([_dumps(r) + "\n" for r in pending]))
        self._trackers.flush()

    def sync(self) -> None:
        """Make every line logged so far durable (called at every checkpoint)."""
        self.flush()
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise path_error(self.path, exc, "sync") from None

    def log_update(self, record: Mapping[str, Any]) -> None:
        # update_record puts "event" first: no copy of the record then
        rec = record if next(iter(record), None) == "event" else {"event": "update", **record}
        if self._fd is None:
            raise PathError(f"{self.path}: the metrics log is closed")
        self._pending.append(rec)  # written by flush(): see the module docstring
        if len(self._pending) >= FLUSH_LINES or time.monotonic() - self._flushed_at >= FLUSH_SECONDS:
            self.flush()
        u = int(rec["update"])
        self._trackers.add(u, update_scalars(rec))
        if self._bar is not None:
            self._bar.update(1)
            if u % self.log_every == 0:
                self._bar.set_postfix(loss=f"{rec.get('loss', float('nan')):.4g}",
                                      lr=f"{(rec.get('lr') or [0])[0]:.3g}", refresh=False)
        elif self._mode == "lines":
            if self._started:
                self._rates.append((rec.get("samples_per_s") or 0.0, rec.get("tokens_per_s"), rec.get("mfu")))
            self._started = True
            if u % self.log_every == 0 or u + 1 == self.total:
                scale = rec.get("loss_scale")
                extra = f" scale {scale:g}" if isinstance(scale, (int, float)) else ""
                skip = " SKIPPED" if rec.get("skipped") else ""
                self.stream.write(
                    f"update {u + 1}/{self.total} epoch {rec.get('epoch')} loss {rec.get('loss', float('nan')):.6g} "
                    f"lr {(rec.get('lr') or [0])[0]:.4g} grad_norm {rec.get('grad_norm', float('nan')):.4g}"
                    f"{extra}{skip} {self._speed()}\n")

    def _speed(self) -> str:
        """The speed of the updates since the previous progress line, without this process's first
        (which compiles and warms up): the harmonic mean of their rates, i.e. their samples over their
        time for equal windows; tokens/s (and MFU) for language data."""
        rates, self._rates = self._rates, []
        if not rates:
            return "(start-up, no speed yet)"

        def mean(values: list[float]) -> float:
            return len(values) / sum(1 / v for v in values) if all(v > 0 for v in values) else 0.0

        if all(t is not None for _, t, _ in rates):
            text = f"{mean([t for _, t, _ in rates]):.0f} tokens/s"
            if all(m is not None for _, _, m in rates):
                text += f" mfu {100 * sum(m for _, _, m in rates) / len(rates):.1f}%"
            return text
        return f"{mean([r for r, _, _ in rates]):.0f} samples/s"

    def log_eval(self, record: Mapping[str, Any]) -> None:
        rec = {"event": "eval", **record}
        self.flush()  # the updates before it come first
        self._write(rec)
        self._trackers.add(int(rec["update"]), eval_scalars(rec))
        if self._mode in ("lines", "bar"):
            parts = " ".join(f"{k} {v:.6g}" for k, v in rec.items()
                             if k not in ("event", "update") and isinstance(v, (int, float)))
            # the update as metrics.jsonl and the loggers number it (the 0-based index of the update it
            # follows), then the count done as the progress lines give it
            u = int(rec["update"])
            line = f"eval at update {u} ({u + 1}/{self.total} done): {parts}\n"
            if self._bar is not None:
                self._bar.write(line.rstrip(), file=self.stream)
            else:
                self.stream.write(line)

    def note(self, text: str) -> None:
        """A line `twinstep: note: TEXT` on the progress stream (not with progress "none")."""
        if self._mode == "none":
            return
        if self._bar is not None:
            self._bar.write(f"twinstep: note: {text}", file=self.stream)
        else:
            self.stream.write(f"twinstep: note: {text}\n")

    def close(self) -> None:
        if self._fd is not None:
            try:
                self.flush()
            finally:
                os.close(self._fd)
                self._fd = None
        if self._bar is not None:
            self._bar.close()
        self._trackers.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
