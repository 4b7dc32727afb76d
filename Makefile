# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# silero-vad's wheel carries the ONNX model we run on onnxruntime; its declared
# dependency on torch is for its own PyTorch loader, which we never import.
SILERO_VAD := silero-vad==6.2.3
HOST ?= 127.0.0.1
PORT ?= 8000
CONFIG ?= configs/default.yaml

.PHONY: run test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -m pip install -q --no-deps $(SILERO_VAD)
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed-run
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed-run
	$(BIN)/duplex-gateway serve --config $(CONFIG) --host $(HOST) --port $(PORT)

test: $(VENV)/.installed-test
	$(BIN)/ruff check duplex_gateway tests
	$(BIN)/mypy duplex_gateway
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest

clean:
	rm -rf $(VENV)
