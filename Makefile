# shardwise — the two set-up commands are `make demo` and `make test` (see README.md).
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS       ?= $(shell nproc)
CMAKE_FLAGS ?=

# Debian packages the build needs (installed only when missing). libblis-dev and libdnnl-dev are
# GEMM candidates loaded at run time (`shardwise gemm-check`): a machine without them builds and runs.
DEB_PACKAGES := cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev \
                libcli11-dev libfmt-dev libopenblas-dev valgrind libopenmpi-dev openmpi-bin \
                libxxhash-dev libssl-dev libsentencepiece-dev pkg-config python3 python3-dev python3-venv \
                libblis-dev libdnnl-dev
# Only `make fuzz` needs clang; only `make golden` needs PyTorch (Debian's 1.13).
FUZZ_PACKAGES := clang

.PHONY: all deps build test check-layout test-asan fuzz parity hf-parity hf-golden golden llama-golden bf16-golden demo llama-demo bench bench-comm bench-ckpt-dcp gpu-debs gpu-deps-check gpu-check gpu-bench-smoke clean

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	else echo "deps: all Debian packages present"; fi

# The venv the Python package is built with and installed into (PyPI: nanobind, scikit-build-core,
# NumPy, pytest; never PyTorch). Its interpreter configures the build, which then builds the module.
PY_VENV ?= $(BUILD)/py-venv
PY_BUILD_PACKAGES := nanobind scikit-build-core numpy pytest
$(PY_VENV)/.ready:
	@python3 -m venv $(PY_VENV) 2>/dev/null || { SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO=sudo; \
	  $$SUDO apt-get install -y -qq python3-venv && python3 -m venv $(PY_VENV); }
	$(PY_VENV)/bin/pip install -q $(PY_BUILD_PACKAGES)
	@touch $@

$(BUILD)/build.ninja: | $(PY_VENV)/.ready
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_PYTHON=ON \
	  -DPython_EXECUTABLE=$(abspath $(PY_VENV))/bin/python $(CMAKE_FLAGS)

build: deps $(PY_VENV)/.ready $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Release build with assertions on; every GoogleTest test through ctest, and the Python package's
# pytest suite (ctest python_package) against the package pip installs from this same build
# directory (scikit-build-core reuses it: nothing is compiled twice).
test: build
	$(PY_VENV)/bin/pip install -q --no-build-isolation --no-deps -Cbuild-dir=$(BUILD) \
	  -Ccmake.define.SHARDWISE_BUILD_TESTS=ON -Ccmake.define.SHARDWISE_BUILD_BENCH=ON .
	@rm -rf $(BUILD)/tests/verify_coverage
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 1200
	@echo; echo "== verifier coverage (op x mesh x placement combinations checked)"
	@cat $(BUILD)/tests/verify_coverage/*.txt 2>/dev/null | awk 'NR == 1 || !/^op /' | grep -v '^total:' || true

# The repository's shape alone (also ctests `layout` and `layout_checker`): file, function and
# folder sizes, and no include that runs up a layer.
check-layout:
	python3 tools/check_layout.py .
	python3 tests/layout/test_check_layout.py .

# The same tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDWISE_SANITIZE=ON -DSHARDWISE_BUILD_BENCH=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/.lsan-suppressions \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 3600

# libFuzzer on the safetensors reader (clang, ASan + UBSan), seeded with the committed corpus in
# fuzz/corpus; new inputs go to $(FUZZ_BUILD)/corpus. Not part of `make test`.
fuzz: deps
	@dpkg-query -W -f='$${Status}' clang 2>/dev/null | grep -q "install ok installed" || \
	  { SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO=sudo; $$SUDO apt-get install -y -qq $(FUZZ_PACKAGES); }
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DSHARDWISE_FUZZ=ON -DSHARDWISE_BUILD_TESTS=OFF -DSHARDWISE_BUILD_BENCH=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_safetensors
	mkdir -p $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/fuzz/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 \
	  $(FUZZ_BUILD)/corpus fuzz/corpus

# Files written by shardwise, loaded by Hugging Face's safetensors (pip) and compared byte for byte
# with its save_file. Not part of `make test` (needs PyPI).
parity: build
	python3 -c "import safetensors, numpy" 2>/dev/null || pip install -q safetensors numpy
	python3 tools/ckpt_parity.py $(BUILD)/bin/shardwise tests/ckpt/fixtures/hf_mlp_f32_with_metadata.safetensors

# transformers and PEFT against shardwise (tools/hf_parity.py), in a venv of PyPI's torch, transformers,
# peft and safetensors ($(HF_VENV), made once). `make hf-golden` also rewrites tests/golden/hf, the
# small files `make test` replays, and tests/golden/gptj_losses.json, vit_{classes,reward}_losses.json and
# embed_{contrastive,reward}_losses.json (tools/pymodel_golden.py: the Python-written examples/gptj.py,
# vit_tiny.py and sentence_embedding.py in PyTorch). Neither is part of `make test`.
HF_VENV ?= $(BUILD)/hf-venv
$(HF_VENV)/bin/python:
	python3 -m venv $(HF_VENV)
	$(HF_VENV)/bin/pip install -q torch transformers peft safetensors numpy
hf-parity: build $(HF_VENV)/bin/python
	$(HF_VENV)/bin/python tools/hf_parity.py $(BUILD)/bin/shardwise
	$(HF_VENV)/bin/python tools/hf_mixtral.py $(BUILD)/bin/shardwise
	$(HF_VENV)/bin/python tools/hf_families.py $(BUILD)/bin/shardwise
	$(HF_VENV)/bin/python tools/hf_lora_llama.py $(BUILD)/bin/shardwise
	$(HF_VENV)/bin/python tools/hf_resize_vocab.py $(BUILD)/bin/shardwise
hf-golden: build $(HF_VENV)/bin/python
	$(HF_VENV)/bin/python tools/hf_parity.py $(BUILD)/bin/shardwise --golden tests/golden/hf
	$(HF_VENV)/bin/python tools/hf_mixtral.py $(BUILD)/bin/shardwise --golden tests/golden/hf
	$(HF_VENV)/bin/python tools/hf_families.py $(BUILD)/bin/shardwise --golden tests/golden/hf
	$(HF_VENV)/bin/python tools/hf_lora_llama.py $(BUILD)/bin/shardwise --golden tests/golden/hf
	$(HF_VENV)/bin/python tools/hf_resize_vocab.py $(BUILD)/bin/shardwise --golden tests/golden/hf
	$(PY_VENV)/bin/pip install -q --no-build-isolation --no-deps -Cbuild-dir=$(BUILD) .
	$(PY_VENV)/bin/python tools/pymodel_golden.py export $(BUILD)/gptj_inputs.npz
	$(HF_VENV)/bin/python tools/pymodel_golden.py torch $(BUILD)/gptj_inputs.npz tests/golden/gptj_losses.json
	for head in classes reward; do \
	  $(PY_VENV)/bin/python tools/pymodel_golden.py export-vit $$head $(BUILD)/vit_$${head}_inputs.npz && \
	  $(HF_VENV)/bin/python tools/pymodel_golden.py torch-vit $(BUILD)/vit_$${head}_inputs.npz \
	    tests/golden/vit_$${head}_losses.json || exit 1; \
	done
	for head in contrastive reward; do \
	  $(PY_VENV)/bin/python tools/pymodel_golden.py export-embed $$head $(BUILD)/embed_$${head}_inputs.npz && \
	  $(HF_VENV)/bin/python tools/pymodel_golden.py torch-embed $(BUILD)/embed_$${head}_inputs.npz \
	    tests/golden/embed_$${head}_losses.json || exit 1; \
	done

# The collectives of the GPT on dp=2 x tp=2, then 1.5-6 minutes of training (examples/demo.toml; README: measured)
# into runs/demo-<time>, which keeps its last checkpoint, then a few sums answered from it.
# Builds only the shardwise binary (not the tests and benchmarks).
demo: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target shardwise
	@bash examples/demo.sh $(BUILD)/bin/shardwise

# A SentencePiece tokenizer, a small Llama trained on tests/data/fables.txt through it, and generation
# from its checkpoint (examples/llama_tiny.sh, examples/llama_tiny.toml; about 20 s). Builds only
# the shardwise binary.
llama-demo: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target shardwise
	@bash examples/llama_tiny.sh $(BUILD)/bin/shardwise

# The PyTorch reference of the trainer: shardwise exports its initial weights and batches, Debian's
# PyTorch (python3-torch 1.13) trains the same model on them and writes tests/golden/gpt_losses.json,
# which tests/models/test_golden.cc replays. Not part of `make test`.
golden: build
	@dpkg-query -W -f='$${Status}' python3-torch 2>/dev/null | grep -q "install ok installed" || \
	  { SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO=sudo; $$SUDO apt-get install -y -qq python3-torch python3-numpy; }
	$(BUILD)/tests/golden_export $(BUILD)/golden_inputs.safetensors
	/usr/bin/python3 tests/golden/gpt_parity.py $(BUILD)/golden_inputs.safetensors tests/golden/gpt_losses.json

# The same for the Llama model against transformers' LlamaForCausalLM (PyPI torch and transformers in
# $(HF_VENV)): tests/golden/llama_losses.json, replayed by tests/models/test_llama_golden.cc.
llama-golden: build $(HF_VENV)/bin/python
	$(BUILD)/tests/golden_export $(BUILD)/llama_golden_inputs.safetensors llama
	$(HF_VENV)/bin/python tests/golden/llama_parity.py $(BUILD)/llama_golden_inputs.safetensors \
	  tests/golden/llama_losses.json

# The MoE Llama against transformers' MixtralForCausalLM (llama_parity.py, the same venv):
# tests/golden/moe_losses.json, replayed by tests/models/test_llama_golden.cc.
moe-golden: build $(HF_VENV)/bin/python
	$(BUILD)/tests/golden_export $(BUILD)/moe_golden_inputs.safetensors moe
	$(HF_VENV)/bin/python tests/golden/llama_parity.py $(BUILD)/moe_golden_inputs.safetensors \
	  tests/golden/moe_losses.json

# GPT-2 with --compute bf16 against PyTorch's CPU autocast to bf16 (the same venv's torch):
# tests/golden/gpt_bf16_losses.json, replayed by tests/models/test_bf16_golden.cc.
bf16-golden: build $(HF_VENV)/bin/python
	$(BUILD)/tests/golden_export $(BUILD)/bf16_golden_inputs.safetensors gpt2-bf16
	$(HF_VENV)/bin/python tests/golden/bf16_autocast_parity.py $(BUILD)/bf16_golden_inputs.safetensors \
	  tests/golden/gpt_bf16_losses.json

bench: build
	@bash bench/run.sh $(BUILD)

# Collectives: mpi backend vs raw MPI (mpirun -np 2), local backend vs memcpy.
bench-comm: build
	@bash bench/run_comm.sh $(BUILD)

# shardwise.checkpoint against torch.distributed.checkpoint (bench/ckpt_dcp.py: a 4-process torchrun
# save of GPT-2 124M + AdamW, 2-process loads as Shard(1) and whole, transformers from_pretrained):
# the package of this build as a wheel, installed into HF_VENV (torch, transformers).
bench-ckpt-dcp: build $(HF_VENV)/bin/python
	rm -rf $(BUILD)/wheel
	$(PY_VENV)/bin/pip wheel -q --no-build-isolation --no-deps -Cbuild-dir=$(BUILD) \
	  -Ccmake.define.SHARDWISE_BUILD_TESTS=ON -Ccmake.define.SHARDWISE_BUILD_BENCH=ON -w $(BUILD)/wheel .
	$(HF_VENV)/bin/pip install -q --no-deps --force-reinstall $(BUILD)/wheel/shardwise-*.whl
	$(HF_VENV)/bin/python bench/ckpt_dcp.py --dir $(BUILD)/ckpt_dcp

# The GPU machine (docs/gpu.md) fetches nothing: `gpu-debs` downloads the Debian packages its build
# needs (tools/gpu_debs.txt) into .gpu_debs and the Python wheels of its package build
# (tools/gpu_wheels.txt) into .gpu_debs/wheels, the folder a device run carries; `gpu-deps-check`
# proves here that they suffice (unpacked into a prefix, the project configured with this machine's
# copies hidden, a few targets built); `gpu-check` is what the GPU machine runs (logs in GPU_OUT).
GPU_DEBS ?= .gpu_debs
GPU_OUT  ?= gpu-check-out
gpu-debs:
	@[ -n "$$(ls $(GPU_DEBS)/*.deb 2>/dev/null)" ] || tools/gpu_deps.sh download $(GPU_DEBS)
	@[ -n "$$(ls $(GPU_DEBS)/wheels/*.whl 2>/dev/null)" ] || tools/gpu_deps.sh wheels $(GPU_DEBS)

gpu-deps-check: gpu-debs
	tools/gpu_deps.sh selftest $(GPU_DEBS) build-gpudeps

gpu-check:
	tools/gpu_check.sh $(GPU_OUT)
# bench/gpu_vs_torch.py's PyTorch rows at tiny shapes on the CPU (eager and torch.compile; minutes
# on a busy machine): the GPU benchmark runs before the GPU machine does. TORCH_PYTHON needs PyTorch 2.x.
TORCH_PYTHON ?= python3
gpu-bench-smoke:
	$(TORCH_PYTHON) bench/gpu_vs_torch.py --cpu-smoke --budget 900 --steps 2 --warmup 1 --shardwise $(BUILD)/bin/shardwise

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
