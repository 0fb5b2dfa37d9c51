"""`python -m tooljaild` is the `tooljail` command."""

import sys

from tooljaild.cli import main

sys.exit(main())
