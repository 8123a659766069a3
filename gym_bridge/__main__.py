"""`python -m gym_bridge ...` is the `gym-bridge` command (with the current directory importable, as `-m` makes it)."""

import sys

from gym_bridge.cli import main

sys.exit(main())
