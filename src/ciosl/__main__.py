"""`python -m ciosl`: the command line."""

import sys

from ciosl.cli import main

sys.exit(main())
