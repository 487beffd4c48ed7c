"""The leaf layer of fa2-verify: what every other layer shares, importing nothing else of the project.

``errors`` (the one error hierarchy), ``contract`` (the kernel contract and
:class:`~fa2_verify.core.contract.Capabilities`), ``case`` (the case record,
:class:`~fa2_verify.core.case.CaseSpec`), ``varlen`` (its extension to packed
batches, :class:`~fa2_verify.core.varlen.VarlenSpec`), ``layouts`` (the memory
layouts a case's inputs can be passed in), ``values`` (the seeded value
generators a case is built from), ``atomic`` (atomic file writes) and
``outputs`` (output paths checked before any work, reports written through
``atomic``).  The layers above it, each importing only downwards
(docs/design.md, "Layers"): ``kernels`` and ``golden``; ``verify``;
``records``; ``bench`` and ``properties``; ``cli``.
"""
