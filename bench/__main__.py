"""`python -m bench ...`: the same commands as `bookstream bench ...`."""
import sys

from bench.cli import main

sys.exit(main())
