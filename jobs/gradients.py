"""`python -m jobs.gradients ...` is `cropi gradients ...`: the same arguments, the same job."""

import sys

from cropi.cli import main

if __name__ == "__main__":
    sys.exit(main(["gradients", *sys.argv[1:]]))
