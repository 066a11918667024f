"""`[data] name = "arrays"`: NumPy arrays in files, memory-mapped, as a map-style data set.

    [data]
    name = "arrays"
    path = "train.npz"          # an .npz file (np.savez), or a directory of .npy files
    val_path = "val.npz"        # optional; else data.val_fraction splits path's samples
    inputs = "x"                # the entry the model is called on
    targets = "y"               # the entry [loss] compares the output with

Each entry is one array with samples on its first axis: the member `x.npy` of an .npz file, or the
file `x.npy` of a directory. Everything is opened read-only as np.memmap: an .npy file directly, an
.npz member at its offset inside the archive (np.savez stores members uncompressed; a compressed
one, from np.savez_compressed, cannot be mapped and is refused). Object arrays (pickles) are
refused. The data set is then the one train(..., data={...}) builds (conformance.data.user).
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from conformance.config.data import DataSpec
from conformance.data.splits import Dataset
from conformance.data.opening import open_data
from conformance.data.user import user_dataset
from conformance.errors import ConfigError, InputError


def _header(f: BinaryIO, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
    except ValueError as exc:
        raise InputError(f"{where} is not a .npy array ({exc})") from None
    if dtype.hasobject:
        raise InputError(f"{where} holds Python objects (a pickle); only numeric arrays can be read")
    return shape, fortran, dtype


def _map(f: BinaryIO, offset: int, shape: tuple[int, ...], fortran: bool, dtype: np.dtype) -> np.ndarray:
    # maps the open (checked) file; the map stays valid after the file object is closed
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype)
    return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _npy(path: Path, field: str) -> np.ndarray:
    f, _ = open_data(path, f"{field}: {path}", missing=ConfigError)  # a FIFO or a device: refused, unread
    with f:
        shape, fortran, dtype = _header(f, str(path))
        return _map(f, f.tell(), shape, fortran, dtype)


def _npz(path: Path, field: str) -> dict[str, np.ndarray]:
    out = {}
    f, _ = open_data(path, f"{field}: {path}", missing=ConfigError)
    try:
        with f, zipfile.ZipFile(f) as z:
            for info in z.infolist():
                where = f"{path} member {info.filename}"
                if not info.filename.endswith(".npy"):
                    raise InputError(f"{where} is not a .npy array")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise InputError(f"{where} is compressed (np.savez_compressed) and cannot be memory-mapped; "
                                     f"save it with np.savez")
                f.seek(info.header_offset)
                local = f.read(30)  # the local file header: its name and extra field lengths end it
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                f.seek(info.header_offset + 30 + name_len + extra_len)
                shape, fortran, dtype = _header(f, where)
                out[info.filename[:-4]] = _map(f, f.tell(), shape, fortran, dtype)
    except zipfile.BadZipFile:
        raise InputError(f"{path} is not an .npz file (not a zip archive)") from None
    return out


def open_arrays(name: str, field: str) -> dict[str, np.ndarray]:
    """{entry: memory-mapped array} of an .npz file or a directory of .npy files."""
    path = Path(name).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise ConfigError(f"{field}: the directory {path} holds no .npy file")
        return {f.stem: _npy(f, field) for f in files}
    if not path.exists():
        raise ConfigError(f"{field}: {path}: no such file or directory")
    if path.suffix == ".npz":
        return _npz(path, field)
    if path.suffix == ".npy":
        raise ConfigError(f"{field}: {path} is one array; name a directory of .npy files (one per entry, "
                          f"e.g. x.npy and y.npy) or an .npz file")
    raise ConfigError(f"{field}: {path} is neither an .npz file nor a directory of .npy files")


def load_arrays(spec: DataSpec, seed: int, needs_targets: bool = True) -> Dataset:
    """The Dataset of data.path (and data.val_path), memory-mapped."""
    train = open_arrays(spec.path or "", "data.path")  # DataSpec requires path
    data: Any = train if spec.val_path is None else (train, open_arrays(spec.val_path, "data.val_path"))
    val_file = (spec.path or "") if spec.val_path is None else spec.val_path  # a split's validation rows: data.path's
    return user_dataset(spec, data, seed, needs_targets, name="arrays", where="data.path",
                        origins=(entry_file(spec.path or ""), entry_file(val_file)))


def entry_file(name: str) -> Callable[[str], str]:
    """How errors name entry `key` of data.path / data.val_path: DIR/key.npy, or FILE.npz's member."""
    path = Path(name).expanduser()
    return (lambda key: str(path / f"{key}.npy")) if path.is_dir() else (lambda key: f"{path} entry {key!r}")
