"""The case sets, one module each: :mod:`~app.cases.fixed` and :mod:`~app.cases.scale` (``run``),
:mod:`~app.cases.race` (``race``), :mod:`~app.cases.gate_corpus` with its ``gate.json`` (``baseline``,
``gate``, ``corpus``) and :mod:`~app.cases.bench_checks` (``bench``); :mod:`~app.cases.fitting` fits a
case to a kernel, :mod:`~app.cases.sets` picks a set and its cases by name.
"""
