"""`python -m pigeon` is `pigeon`."""

import os
import sys

# `-m` puts the directory it runs in first on the import path, where an operator's own files
# (a dns.py beside pigeon.toml, the node's usual working directory) would stand in for the
# modules of Python, Pigeon and its libraries: out, as the supervisor's -P keeps it out of the
# workers'. (With -P, or PYTHONSAFEPATH, it is not there.)
if not sys.flags.safe_path and sys.path and sys.path[0] == os.getcwd():
    del sys.path[0]

from pigeon.cli.main import main  # (after the import path is made safe)

sys.exit(main())
