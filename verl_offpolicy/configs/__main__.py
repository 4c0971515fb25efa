"""``python -m verl_offpolicy.configs --write-readme``: regenerate the README's preset table."""

import sys

from verl_offpolicy.configs import main

sys.exit(main())
