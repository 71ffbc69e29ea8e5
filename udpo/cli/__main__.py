"""``python -m udpo.cli``: the ``udpo`` command."""

import sys

from udpo.cli import main

sys.exit(main())
