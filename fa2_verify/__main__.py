"""``python -m fa2_verify``: the ``fa2-verify`` command line."""

import sys

from fa2_verify.cli.main import main

sys.exit(main())
