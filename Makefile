# The two commands of the README. Each creates the virtual environment and installs everything.
PYTHON ?= python3
VENV ?= .venv
MINUTES ?= 20
WEB := export/web

$(VENV)/.installed: pyproject.toml $(WEB)/package-lock.json
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[test]"
	@# the page's JavaScript packages (served by `kformer serve`), pinned by the lock file
	npm ci --prefix $(WEB) --no-audit --no-fund --loglevel=error || \
	echo "note: npm ci failed; the page of kformer serve and the browser tests need it"
	touch $@

# Debian's Chromium for the browser tests (Playwright's own browser download is not reachable here),
# and a Chinese font for the page's screenshot.
BROWSER_PACKAGES := chromium fonts-wqy-microhei
.PHONY: chromium
chromium:
	@missing=$$(for p in $(BROWSER_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | \
	grep -q "ok installed" || echo $$p; done); [ -z "$$missing" ] || \
	apt-get install -y -q $$missing >/dev/null || \
	{ apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null; } || \
	echo "note: could not install $$missing (root needed); the browser tests will skip (fail if CI=true)"

# The real Argos Translate and LibreTranslate that tests/test_argos.py installs kformer's packages
# into, each in a venv of its own inside $(VENV): their pins clash with kformer's and with each
# other's (LibreTranslate runs its fork, argos-translate-lt, under the same module name).
# The real transformers (with torch) that tests/test_import.py builds Marian models with and
# checks kformer's imports against (with CTranslate2, whose Marian converter needs them): never a
# dependency of kformer itself.
ARGOS_VENVS := $(VENV)/argostranslate/.installed $(VENV)/libretranslate/.installed $(VENV)/transformers/.installed
$(VENV)/argostranslate/.installed: PACKAGE := argostranslate==1.11.0
$(VENV)/libretranslate/.installed: PACKAGE := libretranslate==1.9.6
$(VENV)/transformers/.installed: PACKAGE := torch==2.13.0 transformers==5.23.0 sentencepiece==0.2.3 safetensors==0.8.0 ctranslate2==4.8.5
$(ARGOS_VENVS): | $(VENV)/.installed
	@echo "installing $(PACKAGE) in $(@D)"
	@$(PYTHON) -m venv $(@D) && $(@D)/bin/pip install --quiet $(PACKAGE) && touch $@ || \
	echo "note: could not install $(PACKAGE); the tests that need it will skip (fail if CI=true)"

.PHONY: demo test
demo: $(VENV)/.installed  ## train on Tatoeba zh-en for MINUTES, report BLEU, show translations
	$(VENV)/bin/kformer demo --out runs/demo --config small --minutes $(MINUTES)

# The suite in TEST_WORKERS processes (pytest-xdist), a test file to a process: most tests wait on
# subprocesses or run one thread, so on 2 cores two processes took 30 minutes where one took 40.
TEST_WORKERS ?= 2

test: $(VENV)/.installed chromium $(ARGOS_VENVS)  ## format and lint checks, then the whole test suite (tiny configs)
	$(VENV)/bin/ruff format --check kformer export tests notebooks  # `ruff format` fixes what this finds
	$(VENV)/bin/ruff check kformer export tests notebooks
	$(VENV)/bin/python -m pytest -q --numprocesses $(TEST_WORKERS) --dist loadfile
