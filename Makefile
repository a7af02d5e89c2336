# The two commands of a fresh machine: `make demo` and `make test`.
# `make` creates .venv on first use and reinstalls when a requirements file changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= p5
OUT ?= out

.PHONY: demo test plan finetune clean

$(VENV)/.installed: requirements.txt requirements-dev.txt training/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

## demo: the offline plan of $(STACK) (resources, key settings, Kubernetes YAML under $(OUT)/)
##       and a small FSDP fine-tune with 2 CPU processes through torchrun
demo: plan finetune

plan: $(VENV)/.installed
	$(PY) -m components.offline --stack $(STACK) --out $(OUT)/$(STACK)

finetune: $(VENV)/.installed
	bash training/demo.sh $(OUT)/finetune

## test: the whole suite (mocks, schemas, promtool, real torch/gloo and etcd runs)
test: $(VENV)/.installed
	$(PY) -m pytest

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
