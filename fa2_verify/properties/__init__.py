"""The property suite: Hypothesis drives a kernel with inputs that real bugs hide behind.

``pytest properties --kernel=NAME|module:attr`` (or ``fa2-verify suite``) runs
every property test against one kernel target; :mod:`properties.plugin` is
the pytest plugin (entry point ``fa2_verify``) that provides the options, the
profiles and the report.  The parts, one concept per module:

* strategies: :mod:`~properties.shapes`, :mod:`~properties.masks`,
  :mod:`~properties.inputs` (dtype, value generator, seed, softmax scale),
  :mod:`~properties.cases` (a whole :class:`~core.case.CaseSpec`) and
  :mod:`~properties.varlen` (packed batches), validated by
  :mod:`~properties.validation`;
* :mod:`~properties.profiles`: the ``dev``, ``ci`` and ``nightly`` settings;
* the checks behind the tests: :mod:`~properties.golden_checks`,
  :mod:`~properties.relation_checks` and :mod:`~properties.determinism_checks`,
  on the shared :mod:`~properties.verdicts`, built from
  :mod:`~properties.runs` (calling the kernel), :mod:`~properties.relations`
  (metamorphic transformations) and :mod:`~properties.determinism` (the dQ
  spread bound);
* :mod:`~properties.harness` (declaring and searching property tests) and
  :mod:`~properties.session` (the per-run :class:`~properties.session.Suite`);
* the tests: ``test_golden.py`` (every output against the mpmath golden),
  ``test_metamorphic.py`` (the kernel against itself on related inputs) and
  ``test_determinism.py``.

A property test draws a case (a spec: values come from a seeded generator of
:mod:`core.values`, never element by element), runs the kernel and makes one
assertion; a failure shrinks to a minimal case whose one-line reproduction is
in the message.
"""
