"""``python -m rlft``: the same as the ``rlft`` command (what each rank runs under torchrun)."""

import sys

from rlft.cli import main

sys.exit(main())
