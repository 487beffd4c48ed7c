"""The application layer: what the front ends (the commands of :mod:`cli`, the pytest plugin of
:mod:`properties`, the benchmark of :mod:`bench`) share, on top of :mod:`verify`.

:mod:`app.targets` resolves and loads a kernel target (once per process);
:mod:`app.cases` holds the case sets, one module each; :mod:`app.runs` the
runs that several commands make.  Importing it is cheap.
"""
