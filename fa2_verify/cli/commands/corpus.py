"""``fa2-verify corpus``: list the gate corpus, or add a case to it.

``fa2-verify corpus add --case JSON`` appends the case spec that a failure's
reproduction line prints (:meth:`core.case.CaseSpec.reproduction`), so a
counterexample found by the property suite joins the gate corpus in one
command.  Adding bumps ``corpus_version``; baselines recorded on the older
version no longer match and must be recorded again (docs/reports-and-gate.md).
"""

from __future__ import annotations

import dataclasses

from fa2_verify.app.cases.gate_corpus import load_corpus, save_corpus
from fa2_verify.cli.arguments import add_corpus_option, parse_case
from fa2_verify.core.outputs import check_outputs


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("corpus", help="list the gate corpus or add a case (a counterexample) to it")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="one line per corpus case")
    add = actions.add_parser("add", help="append a case spec (JSON, as printed by a reproduction line)")
    add.add_argument("--case", required=True, metavar="JSON", help="case spec JSON; a missing name is derived from it")
    add.add_argument("--name", help="name for the new case (default: the spec's name, else cex-<hash>)")
    for sub in (listing, add):
        add_corpus_option(sub)
    listing.set_defaults(handler=handle_list)
    add.set_defaults(handler=handle_add)


def handle_list(args) -> int:
    corpus = load_corpus(args.corpus)
    print(f"{args.corpus}: corpus version {corpus.version}, {len(corpus.cases)} cases, {corpus.digest()}")
    for spec in corpus.cases:
        print(
            f"  {spec.name:<32} {spec.dtype:<9} {spec.feature():<12} b={spec.batch} sq={spec.seqlen_q} "
            f"sk={spec.seqlen_k} hq={spec.heads_q} hkv={spec.heads_kv} d={spec.head_dim} "
            f"{spec.generator} seed={spec.seed}{' deterministic' if spec.deterministic else ''}"
        )
    return 0


def handle_add(args) -> int:
    check_outputs({"--corpus": args.corpus}, overwrite=True)  # rewritten in place, so it must be writable
    corpus = load_corpus(args.corpus)
    spec = parse_case(args.case)
    if args.name:
        spec = dataclasses.replace(spec, name=args.name)
    updated = corpus.with_case(spec)
    save_corpus(updated, args.corpus)
    added = updated.cases[-1]
    print(f"added {added.name!r} to {args.corpus}: corpus version {corpus.version} -> {updated.version}")
    print(
        "baselines recorded on the previous version no longer match: record them again with "
        "`fa2-verify baseline --kernel NAME --out FILE --overwrite`"
    )
    return 0
