# The two commands of the README. Each creates the virtual environment and installs everything.
PYTHON ?= python3
VENV ?= .venv
MINUTES ?= 20

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[test]"
	touch $@

.PHONY: demo test
demo: $(VENV)/.installed  ## train on Tatoeba zh-en for MINUTES, report BLEU, show translations
	$(VENV)/bin/kformer demo --out runs/demo --config small --minutes $(MINUTES)

test: $(VENV)/.installed  ## lint, then the whole test suite (tiny configs)
	$(VENV)/bin/ruff check kformer export tests notebooks
	$(VENV)/bin/python -m pytest -q
