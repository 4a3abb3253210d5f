#!/usr/bin/env python
"""The scheduler's door: run one cropi job file.

    python jobs/run.py JOB.json [--shard I/N]

SLURM array job: ``--shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT"``. The job
file is validated by cropi's own options models before anything runs (see README.md
here and cropi/pipeline/jobfile.py); the exit status is 0 on success, 2 on bad input.
This file is a script, not an installed package: it needs only an installed cropi.
"""

import sys

from cropi.cli import main

if __name__ == "__main__":
    sys.exit(main(["job", *sys.argv[1:]]))
