"""``python -m fa2_verify.bench``: the kernel benchmark (:mod:`bench.run`)."""

import sys

from fa2_verify.bench.run import main

sys.exit(main())
