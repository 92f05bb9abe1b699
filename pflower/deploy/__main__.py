"""``python -m pflower.deploy``: the same as ``pflower deploy``."""

import sys

from pflower.deploy.cli import main

sys.exit(main(sys.argv[1:]))
