"""`python -m jobs.collect ...` is `cropi collect ...`: the same arguments, the same job."""

import sys

from cropi.cli import main

if __name__ == "__main__":
    sys.exit(main(["collect", *sys.argv[1:]]))
