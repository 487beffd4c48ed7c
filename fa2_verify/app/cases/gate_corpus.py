"""The gate corpus bundled with fa2-verify (``gate.json``, beside this module), read and written.

The record and its checks are :class:`verify.corpus.Corpus`; this module reads
a corpus file (the bundled one by default, ``--corpus FILE`` otherwise) and
writes one back (``fa2-verify corpus add``).
"""

from __future__ import annotations

import json
import pathlib

from fa2_verify.core.user_json import read_json
from fa2_verify.core.outputs import write_text_atomic
from fa2_verify.verify.corpus import SCHEMA_VERSION, Corpus, corpus_from_dict

#: The corpus shipped with fa2-verify.
DEFAULT_PATH = pathlib.Path(__file__).resolve().parent / "gate.json"


def load_corpus(path: str | pathlib.Path = DEFAULT_PATH) -> Corpus:
    """Read and validate the corpus at ``path``."""
    record = read_json(path, f"--corpus={path}")
    return corpus_from_dict(record, source=f"--corpus={path}")


def save_corpus(corpus: Corpus, path: str | pathlib.Path) -> pathlib.Path:
    """Write ``corpus`` to ``path`` atomically (one case per line, so diffs stay readable)."""
    lines = ",\n".join("    " + json.dumps(spec.to_dict(), sort_keys=True) for spec in corpus.cases)
    text = (
        "{\n"
        f'  "schema_version": {SCHEMA_VERSION},\n'
        f'  "corpus_version": {corpus.version},\n'
        '  "cases": [\n'
        f"{lines}\n"
        "  ]\n"
        "}\n"
    )
    return write_text_atomic(path, text, overwrite=True, flag="--corpus")
