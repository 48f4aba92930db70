"""``python -m kprobefs`` is the ``kprobefs`` command."""

import sys

from .cli import main

sys.exit(main())
