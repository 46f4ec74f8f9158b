"""`python -m pigeon` is `pigeon`."""

import sys

from pigeon.cli.main import main

sys.exit(main())
