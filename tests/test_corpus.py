"""The gate corpus: the bundled file, validation of bad corpora, and ``fa2-verify corpus add``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fa2_verify.cli import main as cli
from fa2_verify.core.case import CaseSpec
from fa2_verify.app.cases.gate_corpus import DEFAULT_PATH, load_corpus, save_corpus
from fa2_verify.verify.corpus import Corpus, corpus_from_dict
from fa2_verify.core.errors import UsageError
from fa2_verify.core.values import GENERATORS

SPEC = CaseSpec(batch=1, seqlen_q=7, seqlen_k=9, heads_q=2, heads_kv=1, head_dim=32, dtype="float16", seed=5)


def test_bundled_corpus_is_valid_and_covers_dtypes_masks_and_adversarial_generators():
    corpus = load_corpus()
    assert corpus.dtypes() == ("bfloat16", "float16", "float32")
    features = {spec.feature() for spec in corpus.cases}
    assert {"none", "causal", "window"} <= {feature.split("+")[0] for feature in features}
    assert any("+gqa" in feature for feature in features) and any("+mqa" in feature for feature in features)
    generators = {spec.generator for spec in corpus.cases}
    assert {"dominant-key", "exp-overflow", "dp-cancellation", "rescale-storm", "subnormals"} <= generators
    assert generators <= set(GENERATORS)
    assert any(spec.deterministic for spec in corpus.cases)
    assert all(spec.backward for spec in corpus.cases)


def test_digest_changes_with_any_field_and_not_with_reloading(tmp_path):
    corpus = load_corpus()
    path = save_corpus(corpus, tmp_path / "gate.json")
    assert load_corpus(path).digest() == corpus.digest()
    changed = Corpus(version=corpus.version, cases=(dataclasses.replace(corpus.cases[0], seed=99), *corpus.cases[1:]))
    assert changed.digest() != corpus.digest()


def test_with_case_names_the_counterexample_and_bumps_the_version():
    corpus = Corpus(version=3, cases=(dataclasses.replace(SPEC, name="a"),))
    added = corpus.with_case(dataclasses.replace(SPEC, seed=6))
    assert added.version == 4
    assert added.cases[-1].name.startswith("cex-") and len(added.cases[-1].name) == 14
    with pytest.raises(UsageError, match="already in the corpus as 'a'"):
        corpus.with_case(dataclasses.replace(SPEC, name="renamed"))


GOOD = {"schema_version": 1, "corpus_version": 1, "cases": [dict(SPEC.to_dict(), name="a")]}


@pytest.mark.parametrize(
    "record, message",
    [
        pytest.param([], "expected a JSON object", id="not-an-object"),
        pytest.param(dict(GOOD, schema_version=2), "schema_version=2 is not supported", id="schema"),
        pytest.param(dict(GOOD, cases=[]), "non-empty list", id="no-cases"),
        pytest.param(dict(GOOD, corpus_version=0), "corpus_version=0", id="version-zero"),
        pytest.param(dict(GOOD, cases=[dict(SPEC.to_dict(), name="")]), "has no name", id="unnamed"),
        pytest.param(dict(GOOD, cases=[dict(SPEC.to_dict(), name="a")] * 2), "used by cases #0 and #1", id="duplicate"),
        pytest.param(
            dict(GOOD, cases=[dict(SPEC.to_dict(), name="a", generator="nope")]), "generator='nope'", id="generator"
        ),
        pytest.param(
            dict(GOOD, cases=[dict(SPEC.to_dict(), name="a", colour=1)]), "unknown fields", id="unknown-field"
        ),
        pytest.param(dict(GOOD, cases=[{"name": "a"}]), "case #0", id="incomplete"),
        pytest.param(dict(GOOD, cases=["a"]), "case #0: case spec is a str, expected a JSON object", id="not-a-spec"),
    ],
)
def test_bad_corpus_is_a_one_line_usage_error(record, message):
    with pytest.raises(UsageError, match=message) as raised:
        corpus_from_dict(record, source="--corpus=x.json")
    assert "\n" not in str(raised.value)


def test_unreadable_or_corrupt_corpus_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read it"):
        load_corpus(tmp_path / "missing.json")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_corpus(corrupt)


def test_cli_corpus_add_takes_a_reproduction_spec(tmp_path, capsys):
    path = save_corpus(load_corpus(), tmp_path / "gate.json")
    before = load_corpus(path)
    case = json.dumps(SPEC.to_dict(), sort_keys=True)
    assert SPEC.reproduction("triton").endswith(f"--case '{case}'")
    assert cli.main(["corpus", "add", "--corpus", str(path), "--case", case, "--name", "cex-gqa-tail"]) == 0
    after = load_corpus(path)
    assert after.version == before.version + 1
    assert after.cases[-1] == dataclasses.replace(SPEC, name="cex-gqa-tail")
    assert "corpus version 1 -> 2" in capsys.readouterr().out
    assert cli.main(["corpus", "add", "--corpus", str(path), "--case", case]) == 2
    assert "already in the corpus as 'cex-gqa-tail'" in capsys.readouterr().err
    assert cli.main(["corpus", "add", "--corpus", str(path), "--case", "[1]"]) == 2
    assert load_corpus(path) == after


def test_cli_corpus_list(capsys):
    assert cli.main(["corpus", "list"]) == 0
    out = capsys.readouterr().out
    corpus = load_corpus(DEFAULT_PATH)
    assert f"corpus version {corpus.version}, {len(corpus.cases)} cases, {corpus.digest()}" in out
    assert all(spec.name in out for spec in corpus.cases)
