"""`python -m jaxrl_reason.cli ...`: the `jaxrl-reason` command."""

import sys

from jaxrl_reason.cli import main

sys.exit(main())
