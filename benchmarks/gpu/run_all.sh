#!/usr/bin/env bash
# Every GPU check of issue 11, one command:  bash benchmarks/gpu/run_all.sh  (or `make gpu-checks`).
# Writes benchmarks/results/gpu/{throughput,vllm_logprobs,pytest_gpu}.json. Needs a CUDA device,
# cropi with the vllm extra (GPU build) in $PY, and optionally verl in $VERL_PY for the verl tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
"$PY" benchmarks/gpu/throughput.py --out "$OUT" || status=1
"$PY" benchmarks/gpu/vllm_logprobs.py --out "$OUT" --workdir "${TMPDIR:-/tmp}/cropi-gpu-work" || status=1
# The CUDA tests (marker `gpu`), with a JSON summary from pytest's junit report.
"$PY" -m pytest -q -m gpu --junitxml "$OUT/pytest_gpu.xml" tests || status=1
"$PY" - "$OUT" <<'PYEOF'
import json, sys, xml.etree.ElementTree as ET
out = sys.argv[1]
suite = ET.parse(f"{out}/pytest_gpu.xml").getroot()
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
summary = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
json.dump(summary, open(f"{out}/pytest_gpu.json", "w"), indent=2)
print("gpu tests:", summary)
PYEOF
if [ -n "${VERL_PY:-}" ]; then "$VERL_PY" -m pytest -q tests/test_verl.py || status=1; fi
exit $status
