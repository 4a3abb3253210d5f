#!/bin/bash
# Issue 27's evaluation, as fixed in docs/demo.md (commit ce3c421): lists then skills, 3 seeds, 8 methods.
M=cropi,diverse,positive,full,random,pass_rate,informative,oracle
for T in lists skills; do
  PYTHONPATH=/tmp/snap /work/main/.venv/bin/cropi demo --task $T --methods $M --out /tmp/i27/$T > /tmp/i27/$T.log 2>&1
  echo "$T rc=$? $(date)" >> /tmp/i27/done.txt
done
