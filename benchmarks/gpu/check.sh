#!/usr/bin/env bash
# The GPU check of issue 33, one command on the GPU machine as it is (../shared/GPU.md):
#
#     bash benchmarks/gpu/check.sh            (or `make gpu-checks`; --dry-run: the same on CPU, tiny models)
#
# Uses that machine's own python3 ($PY) and the wheels taken along in .whl/ (pydantic, pydantic-core,
# annotated-types, typing-inspection, dill: installed offline into $SITE, nothing from the network, nothing
# built). Runs the CUDA tests (`-m gpu`), then benchmarks/gpu/check.py, each under its own time limit, the
# whole well inside 8 minutes; writes benchmarks/results/gpu/{pytest_gpu,check,scatter,e2e}.json (or $GPU_OUT/).
# vLLM and verl are not run there (no network, no room for vLLM's GPU wheel): check.json records why. Options
# after the command go to check.py (--dry-run to every script).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=${GPU_OUT:-benchmarks/results/gpu}  # GPU_OUT, not OUT: `make` and the device runner set OUT for their own use
SITE=${SITE:-/tmp/cropi-site}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl || echo "[check] installing .whl/ failed"
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import pydantic, torch, transformers" 2>/dev/null; then
  echo "[check] $PY cannot import pydantic, torch and transformers: put the wheels of ../shared/GPU.md (step 1) in .whl/"
  exit 2
fi
status=0
dry=""
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
# The CUDA tests (marker `gpu`; skipped without CUDA), with a JSON summary from pytest's junit report.
timeout 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml "$OUT/pytest_gpu${dry:+_dry_run}.xml" \
  tests/test_sketch_engines.py tests/test_batched_sketch.py tests/test_factored.py tests/test_projection.py \
  tests/test_checkpoint_layers.py || status=1
"$PY" - "$OUT/pytest_gpu${dry:+_dry_run}" <<'PYEOF' || status=1
import json, sys, xml.etree.ElementTree as ET
stem = sys.argv[1]
suite = ET.parse(f"{stem}.xml").getroot()
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
summary = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
summary["failed"] = [c.get("classname", "") + "::" + c.get("name", "") for c in suite.iter("testcase")
                     if c.find("failure") is not None or c.find("error") is not None]
json.dump(summary, open(f"{stem}.json", "w"), indent=2)
print("[check] gpu tests:", summary)
PYEOF
timeout 330 "$PY" benchmarks/gpu/check.py --out "$OUT" "$@" || status=1
# The cuda direct route's scatter candidates, the engine's own rule among them (benchmarks/gpu/scatter.py; ~10 s)
timeout 90 "$PY" benchmarks/gpu/scatter.py --out "$OUT" ${dry:+--dry-run} || status=1
# The gradients job end to end on CUDA against CPU (benchmarks/gpu/e2e.py), where a `make demo` folder's warm
# start and trajectories were taken along (E2E_WORK; default runs/gpu_e2e: models/theta0 + runs/trajectories).
E2E_WORK=${E2E_WORK:-runs/gpu_e2e}
if [ -d "$E2E_WORK/models/theta0" ]; then
  timeout 150 "$PY" benchmarks/gpu/e2e.py --work "$E2E_WORK" --out "$OUT" ${dry:+--dry-run} || status=1
else
  echo "[check] no $E2E_WORK/models/theta0: the end-to-end comparison skipped (copy a make demo folder's models/theta0 and runs/trajectories there)"
fi
exit $status
