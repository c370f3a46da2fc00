"""``python3 -m gpuzombie.prestop``: the preStop hook with the standard library only."""

import sys

from gpuzombie.prestop.hook import main

sys.exit(main())
