"""What a verification leaves behind: reports, baselines, the gate, Allure results and plots.

``report_json`` (``tolerance.json``), ``report_markdown`` (the CI summaries),
``allure_report`` and ``allure_merge`` (one Allure result per property test,
the shards of a run merged, the HTML report), ``plots`` (the error
histograms), ``baseline`` (a kernel's recorded quantiles, checked against
``schemas/baseline.schema.json``) and ``gate`` (a run against its baseline).
It reads the results of :mod:`verify` and never runs a check of its own;
:mod:`verify` does not import it.  Importing it is cheap.
"""
