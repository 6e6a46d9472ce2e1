"""`python -m switchyard.fleet`."""

import sys

from switchyard.fleet.cli import main

sys.exit(main())
