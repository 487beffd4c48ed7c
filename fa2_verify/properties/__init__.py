"""The property suite: Hypothesis drives a kernel with inputs that real bugs hide behind.

``pytest --pyargs fa2_verify.properties --fa2-kernel=NAME|module:attr`` (or
``fa2-verify suite``) runs every declared property against one kernel target; :mod:`properties.plugin` is
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
* :mod:`~properties.declaration` (a property declared once: name, invariant,
  check, breaker), :mod:`~properties.harness` (declarations made into tests,
  and searched outside pytest) and :mod:`~properties.session` (the per-run
  :class:`~properties.session.Suite`);
* the pytest plugin (:mod:`~properties.plugin`: options and hooks only) and
  what its hooks call: :mod:`~properties.options`,
  :mod:`~properties.device_pinning`, :mod:`~properties.inflight_session`,
  :mod:`~properties.collection`, :mod:`~properties.ordering`,
  :mod:`~properties.runtest`, :mod:`~properties.allure_results` and
  :mod:`~properties.summary`;
* the declarations: ``test_golden.py`` (every output against the mpmath
  golden), ``test_metamorphic.py`` (the kernel against itself on related
  inputs) and ``test_determinism.py``.

A property draws a case (a spec: values come from a seeded generator of
:mod:`core.values`, never element by element), runs the kernel and raises
:class:`~properties.declaration.PropertyFailure` when its invariant does not
hold; a failure shrinks to a minimal case whose one-line reproduction is in the
message.  docs/properties.md says how to add one.
"""
