"""One module per ``fa2-verify`` subcommand (see :mod:`verify.cli`)."""
