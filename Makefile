# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test docs bench lint clean venv sysdeps corpus corpus-impact corpus-score

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py src/laggard/tracer/_fastop.c src/laggard/engine/_replay.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[all]"
	$(BIN)/python -m compileall -q src/laggard
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/laggard demo

# Debian packages the monitor tests use (a PostgreSQL server, headless Chromium, Prometheus); skipped when not
# root or already installed (the tests then skip with a reason)
SYSDEPS := postgresql chromium prometheus
sysdeps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! dpkg -s $(SYSDEPS) >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(SYSDEPS); fi

# the suite on two pytest workers, a test file each at a time (its module fixtures run once), the
# modules that run real multi-rank jobs one after another on one of them (tests/conftest.py): ~10
# minutes here against ~16 on one. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP) sysdeps
	$(BIN)/python -m pytest tests $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)

# the documentation site (mkdocs.yml, docs/) into site/, offline; --strict: a warning (a broken link, a
# docstring mkdocstrings cannot read) fails it. tests/docs/test_site.py builds it in `make test` too.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) build dist *.egg-info out site

# real multi-process jobs with injected stragglers and their truth (benchmarks/real_corpus.py, issue 24):
# not part of `make test`; `make corpus` resumes where it stopped, `make corpus-score` analyses and scores
CORPUS ?= out/corpus
CORPUS_JOBS ?= 64
CORPUS_SEED ?= 2024
CORPUS_STEPS ?= 16  # traced steps a job (32 named more 1.2x causes with a core per rank, not on 2 shared cores: DESIGN)
corpus: $(STAMP)
	$(BIN)/python benchmarks/real_corpus.py generate $(CORPUS) --jobs $(CORPUS_JOBS) --seed $(CORPUS_SEED) --steps $(CORPUS_STEPS)

corpus-impact: $(STAMP)  # each job's clean twin, run for real: the measured impact of its causes
	$(BIN)/python benchmarks/corpus_impact.py $(CORPUS)

corpus-score: $(STAMP)
	$(BIN)/python benchmarks/real_corpus.py score $(CORPUS)
