"""On-disk golden cache, safe to share between parallel workers.

An entry is one file ``<cache_dir>/<key>.golden``, ``key`` being the sha256 of
everything the golden depends on (:func:`key`).  The file holds a magic line,
a JSON header line (key, payload size and sha256, metadata) and the payload,
an uncompressed ``.npz`` of the output arrays (loaded with pickles disabled).

* Writes are atomic: a private temporary file in the same directory, flushed
  and fsynced, then ``os.replace``d onto the entry, so a reader sees the old
  file, no file, or the complete new one.  Concurrent writers of one key
  write identical bytes, and the last rename wins.
* Only entries of at most :data:`MAX_ENTRY_BYTES` of outputs are cached
  (:func:`fits`): a golden at production scale (e.g. 16 heads of 16,384
  tokens: 1.6 GB of float64 outputs) would be written and hashed for longer
  than the fast path takes to recompute it on a GPU, and would fill the disk.
* Reads trust nothing: a wrong magic, key, size, digest, array set or shape
  makes the entry corrupt; :func:`load` then warns
  (:class:`GoldenCacheWarning`) and reports a miss, and the caller recomputes
  and replaces the entry.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pathlib
import warnings
import zipfile

import numpy as np

from fa2_verify.core.atomic import write_bytes_atomic
from fa2_verify.core.errors import UsageError
from fa2_verify.golden.options import CACHE_ENV

MAGIC = b"fa2-verify golden cache 1\n"

#: Bump when the golden's numbers change for the same inputs and options
#: (3: the fast path in torch, whose non-exact products may round differently).
ALGORITHM_VERSION = 3

#: Largest total size of an entry's float64 outputs that is cached: 256 MiB,
#: e.g. forward and backward of 4 heads of 8,192 tokens at head_dim 128.
MAX_ENTRY_BYTES = 2**28


class GoldenCacheWarning(UserWarning):
    """A cache entry was corrupt and is being recomputed."""


def key(tensors: dict[str, tuple[str, np.ndarray] | None], settings: dict) -> str:
    """sha256 over the tensors (name, dtype, shape, float64 bytes) and the JSON of ``settings``."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"algorithm": ALGORITHM_VERSION, **settings}, sort_keys=True).encode())
    for name, entry in tensors.items():
        if entry is None:
            digest.update(f"{name}:absent;".encode())
            continue
        dtype, array = entry
        digest.update(f"{name}:{dtype}:{array.shape};".encode())
        digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
    return digest.hexdigest()


def fits(shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether float64 outputs of these shapes take at most :data:`MAX_ENTRY_BYTES`."""
    return sum(8 * math.prod(shape) for shape in shapes.values()) <= MAX_ENTRY_BYTES


def path(cache_dir: pathlib.Path, entry_key: str) -> pathlib.Path:
    return cache_dir / f"{entry_key}.golden"


def load(cache_dir: pathlib.Path, entry_key: str, shapes: dict[str, tuple[int, ...]]):
    """``(arrays, meta)`` of a valid entry with exactly the arrays ``shapes`` names, else ``None``."""
    entry = path(cache_dir, entry_key)
    try:
        blob = entry.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unusable(cache_dir, "cannot be read", exc) from None
    try:
        return _parse(blob, entry_key, shapes)
    except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as exc:
        message = f"golden cache entry {entry} is corrupt ({exc}); recomputing it"
        warnings.warn(message, GoldenCacheWarning, stacklevel=3)
        return None


def store(cache_dir: pathlib.Path, entry_key: str, arrays: dict[str, np.ndarray], meta: dict) -> pathlib.Path:
    """Write an entry atomically (:func:`core.atomic.write_bytes_atomic`); returns its path."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    payload = buffer.getvalue()
    header = {"key": entry_key, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest(), "meta": meta}
    target = path(cache_dir, entry_key)
    data = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(target, data, overwrite=True)
    except OSError as exc:
        raise _unusable(cache_dir, "is not a writable directory", exc) from None


def _unusable(cache_dir: pathlib.Path, problem: str, exc: OSError) -> UsageError:
    """The one-line error of a cache directory that cannot be used, with the fix in each caller's terms: the
    CLI's ``--golden-cache`` and the environment variable, and ``cache_dir`` of the API."""
    return UsageError(
        f"the golden cache cache_dir={str(cache_dir)!r} {problem} ({exc.strerror or exc}): point --golden-cache or "
        f"${CACHE_ENV} at a writable directory (in the API, cache_dir=None turns the cache off)"
    )


def _parse(blob: bytes, entry_key: str, shapes: dict[str, tuple[int, ...]]):
    if not blob.startswith(MAGIC):
        raise ValueError("bad magic line")
    header_end = blob.index(b"\n", len(MAGIC))
    header = json.loads(blob[len(MAGIC) : header_end])
    payload = blob[header_end + 1 :]
    if header["key"] != entry_key:
        raise ValueError(f"it holds key {header['key']!r}")
    if len(payload) != header["size"]:
        raise ValueError(f"payload is {len(payload)} bytes, header says {header['size']}")
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise ValueError("payload sha256 mismatch")
    with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    if set(arrays) != set(shapes):
        raise ValueError(f"arrays {sorted(arrays)} instead of {sorted(shapes)}")
    for name, shape in shapes.items():
        if arrays[name].shape != tuple(shape) or arrays[name].dtype != np.float64:
            raise ValueError(f"{name} is {arrays[name].dtype}{arrays[name].shape}, expected float64{tuple(shape)}")
    return arrays, header["meta"]
