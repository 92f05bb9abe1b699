"""``python -m pflower ...`` is the same as ``pflower ...``."""

from pflower.cli import main

main()
