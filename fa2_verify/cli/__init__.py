"""The ``fa2-verify`` command line (:mod:`fa2_verify.cli.main`), one module per subcommand in ``commands``."""
