"""On-disk golden cache, safe to share between parallel workers.

An entry is one file ``<cache_dir>/<key>.golden``, ``key`` being the sha256 of
everything the golden depends on (:func:`key`).  The file holds a magic line,
a JSON header line (key, payload size, metadata and the entry's sha256) and
the payload, an uncompressed ``.npz`` of the output arrays (loaded with
pickles disabled).  The entry's sha256 (:func:`digest`) covers the header's
other fields, in canonical JSON (sorted keys, no spaces), and the payload: the
metadata (the method and the ``certified_bound`` that widens every bound of
the error model) is checked as much as the numbers.

* Writes are atomic: a private temporary file in the same directory, flushed
  and fsynced, then ``os.replace``d onto the entry, so a reader sees the old
  file, no file, or the complete new one.  Concurrent writers of one key
  write identical bytes, and the last rename wins.
* Only entries of at most :data:`MAX_ENTRY_BYTES` of outputs are cached
  (:func:`fits`), :data:`MAX_DEVICE_ENTRY_BYTES` for a golden computed on a GPU:
  a larger one would be hashed and written for about as long as the fast path
  takes to recompute it there, and would fill the disk.
* Reads trust nothing: a wrong magic line, a header that does not parse
  (invalid JSON or UTF-8, nesting deep enough to exhaust the recursion
  limit, an integer longer than Python's digit limit), other header fields,
  a wrong key, size or digest, an array set or shape, or metadata the
  caller's ``check_meta`` refuses make the entry corrupt; :func:`load` then
  warns (:class:`GoldenCacheWarning`) and reports a miss, and the caller
  recomputes and atomically replaces the entry.

The digest finds a damaged or hand-edited entry, not an attacker who can
write the cache directory: he rewrites the header and recomputes the digest
as :func:`store` does (nothing here is secret).  What stops him is the
caller's ``check_meta``: :func:`golden.api.compute` refuses a
``certified_bound`` a fresh computation could not give
(:data:`golden.api.MAX_CERTIFIED_BOUND`), so a poisoned entry cannot widen a
bound, and CI restores the cache only from the main branch
(docs/reports-and-gate.md).  Such an attacker can still replace the numbers
themselves, as he can replace any file the run reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pathlib
import warnings
import zipfile
from typing import Callable

import numpy as np

from fa2_verify.core.atomic import write_bytes_atomic
from fa2_verify.core.errors import UsageError
from fa2_verify.golden.options import CACHE_ENV

#: The first line of an entry; 2: the sha256 covers the header as well as the payload.
MAGIC = b"fa2-verify golden cache 2\n"

#: The fields of an entry's header line.
HEADER_FIELDS = frozenset({"key", "size", "meta", "sha256"})

#: Bump when the golden's numbers change for the same inputs and options
#: (3: the fast path in torch, whose non-exact products may round differently).
ALGORITHM_VERSION = 3

#: Largest total size of an entry's float64 outputs that is cached: 256 MiB,
#: e.g. forward and backward of 4 heads of 8,192 tokens at head_dim 128.
MAX_ENTRY_BYTES = 2**28

#: The same for a golden computed on a GPU: 16 MiB, which holds the ``ci``
#: profile's cases there (its largest balanced one, 2 x 8 heads of 160 tokens
#: at head_dim 256, takes 12.6 MiB).  The cache's work is on the host (the
#: inputs copied and hashed for the key; the outputs copied, written and
#: fsynced, or read and checked), and grows with the entry, while the GPU's
#: fast path costs about 0.3 s from 8 to 256 MiB of outputs, mostly the
#: certification.  On an H100 a hit took 0.05 s at 8 MiB, 0.21 s at 32 and
#: 0.40 s at 64 (key and load), and a miss added 0.07, 0.27 and 0.54 s (key
#: and store): at 16 MiB a hit still saves most of a recomputation and a miss
#: costs little, above it a ``scale`` example, rarely drawn twice, mostly
#: pays (docs/benchmarks.md, "The golden cache on a GPU").
MAX_DEVICE_ENTRY_BYTES = 2**24


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


def fits(shapes: dict[str, tuple[int, ...]], device_type: str) -> bool:
    """Whether float64 outputs of these shapes, computed on a device of ``device_type`` (``"cpu"``,
    ``"cuda"``), take at most :data:`MAX_ENTRY_BYTES` (:data:`MAX_DEVICE_ENTRY_BYTES` off the CPU)."""
    limit = MAX_ENTRY_BYTES if device_type == "cpu" else MAX_DEVICE_ENTRY_BYTES
    return sum(8 * math.prod(shape) for shape in shapes.values()) <= limit


def path(cache_dir: pathlib.Path, entry_key: str) -> pathlib.Path:
    return cache_dir / f"{entry_key}.golden"


def load(
    cache_dir: pathlib.Path,
    entry_key: str,
    shapes: dict[str, tuple[int, ...]],
    check_meta: Callable[[object], str | None] = lambda meta: None,
):
    """``(arrays, meta)`` of a valid entry with exactly the arrays ``shapes`` names, else ``None``.

    ``check_meta`` says what is wrong with an entry's metadata (``None``: nothing); an entry it refuses is
    corrupt, as one whose digest does not match.
    """
    entry = path(cache_dir, entry_key)
    try:
        blob = entry.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unusable(cache_dir, "cannot be read", exc) from None
    try:
        return _parse(blob, entry_key, shapes, check_meta)
    except (ValueError, KeyError, TypeError, RecursionError, OSError, EOFError, zipfile.BadZipFile) as exc:
        message = f"golden cache entry {entry} is corrupt ({exc}); recomputing it"
        warnings.warn(message, GoldenCacheWarning, stacklevel=3)
        return None


def store(cache_dir: pathlib.Path, entry_key: str, arrays: dict[str, np.ndarray], meta: dict) -> pathlib.Path:
    """Write an entry atomically (:func:`core.atomic.write_bytes_atomic`); returns its path."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as its allow_pickle
    payload = buffer.getvalue()
    fields = {"key": entry_key, "size": len(payload), "meta": meta}
    target = path(cache_dir, entry_key)
    data = MAGIC + _canonical({**fields, "sha256": digest(fields, payload)}) + b"\n" + payload
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(target, data, overwrite=True)
    except OSError as exc:
        raise _unusable(cache_dir, "is not a writable directory", exc) from None


def digest(fields: dict, payload: bytes) -> str:
    """The sha256 of an entry: of the header's fields but ``sha256`` in canonical JSON, a newline, the payload.

    Canonical JSON (:func:`_canonical`) has no newline, so the two parts cannot be shifted into each other.
    """
    return hashlib.sha256(_canonical(fields) + b"\n" + payload).hexdigest()


def _canonical(header: dict) -> bytes:
    """``header`` as one line of JSON, the same bytes for the same values: sorted keys, no spaces, ASCII only,
    no NaN or infinity (``ValueError``)."""
    return json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _unusable(cache_dir: pathlib.Path, problem: str, exc: OSError) -> UsageError:
    """The one-line error of a cache directory that cannot be used, with the fix in each caller's terms: the
    CLI's ``--golden-cache`` and the environment variable, and ``cache_dir`` of the API."""
    return UsageError(
        f"the golden cache cache_dir={str(cache_dir)!r} {problem} ({exc.strerror or exc}): point --golden-cache or "
        f"${CACHE_ENV} at a writable directory (in the API, cache_dir=None turns the cache off)"
    )


def _parse(blob: bytes, entry_key: str, shapes: dict[str, tuple[int, ...]], check_meta: Callable[[object], str | None]):
    if not blob.startswith(MAGIC):
        raise ValueError("bad magic line")
    header_end = blob.index(b"\n", len(MAGIC))
    header = json.loads(blob[len(MAGIC) : header_end].decode("utf-8"))
    payload = blob[header_end + 1 :]
    if not isinstance(header, dict) or set(header) != HEADER_FIELDS:
        raise ValueError(f"the header is not a JSON object of {sorted(HEADER_FIELDS)}")
    claimed = header.pop("sha256")
    if claimed != digest(header, payload):
        raise ValueError("sha256 of header and payload mismatch")
    if header["key"] != entry_key:
        raise ValueError(f"it holds key {header['key']!r:.80}")
    if len(payload) != header["size"]:
        raise ValueError(f"payload is {len(payload)} bytes, header says {header['size']}")
    problem = check_meta(header["meta"])
    if problem is not None:
        raise ValueError(problem)
    with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    if set(arrays) != set(shapes):
        raise ValueError(f"arrays {sorted(arrays)} instead of {sorted(shapes)}")
    for name, shape in shapes.items():
        if arrays[name].shape != tuple(shape) or arrays[name].dtype != np.float64:
            raise ValueError(f"{name} is {arrays[name].dtype}{arrays[name].shape}, expected float64{tuple(shape)}")
    return arrays, header["meta"]
