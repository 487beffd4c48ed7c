"""``python -m fa2_verify``: the ``fa2-verify`` command line, supervised (:mod:`cli.supervisor`)."""

import sys

from fa2_verify.cli.supervisor import main

sys.exit(main())
