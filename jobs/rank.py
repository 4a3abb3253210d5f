"""`python -m jobs.rank ...` is `cropi rank ...`: the same arguments, the same job."""

import sys

from cropi.cli import main

if __name__ == "__main__":
    sys.exit(main(["rank", *sys.argv[1:]]))
