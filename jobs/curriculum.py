"""`python -m jobs.curriculum --config FILE --root DIR` is `cropi curriculum ...`: the same arguments, the same job."""

import sys

from cropi.cli import main

if __name__ == "__main__":
    sys.exit(main(["curriculum", *sys.argv[1:]]))
