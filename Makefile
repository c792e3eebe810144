# Everything is installed from this project's own files into ./.venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The Spark extra (pyspark, pyarrow: about 700 MB) is installed for the tests only; the plot extra
# (matplotlib: the benchmarks' pictures, docs/benchmarks.md) with the dev one.
SPARK_STAMP := $(VENV)/.installed-spark

.PHONY: dev run test test-fast lint typecheck docs bench bench-produce bench-spark clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,docs,plot]'
	touch $(STAMP)

$(SPARK_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,docs,plot,spark]'
	touch $(SPARK_STAMP)

dev: $(STAMP)

## Run a local 3-node cluster (replication factor 3) on 127.0.0.1 with embedded defaults;
## ARGS go to `kayos up` (`make run ARGS="--base-port 8101"`: docs/guide/getting-started.md).
run: $(STAMP)
	$(BIN)/kayos up $(ARGS)

## The test command: lint, types, the documentation site (docs), then the whole test suite (the
## Spark tier too: java is installed first where the machine has none, deploy/ensure-java.sh;
## iptables for the chaos campaign's partitions where the machine runs as root,
## deploy/ensure-netns-tools.sh; systemd-analyze and docker-compose for the checks of the deploy
## files, also as root, deploy/ensure-deploy-tools.sh).
test: $(STAMP) $(SPARK_STAMP)
	bash deploy/ensure-java.sh
	bash deploy/ensure-netns-tools.sh
	bash deploy/ensure-deploy-tools.sh
	$(BIN)/ruff check kayos kestrel_compat tests chaos
	$(BIN)/mypy
	$(MAKE) docs
	$(BIN)/pytest

## The fast tier, for the edit loop (CONTRIBUTING.md): lint, types and the unit tier (pure and
## in-process tests; no node process, no Spark, no campaign). `make test` stays what CI runs.
test-fast: $(STAMP)
	$(BIN)/ruff check kayos kestrel_compat tests chaos
	$(BIN)/mypy
	$(BIN)/pytest tests/unit -q

lint: $(STAMP)
	$(BIN)/ruff check kayos kestrel_compat tests chaos
	$(BIN)/ruff format --check kayos kestrel_compat tests chaos

typecheck: $(STAMP)
	$(BIN)/mypy

## The documentation site (docs/index.md): site/ from docs/ and mkdocs.yml. Strict: a warning (a
## broken link or anchor, a page missing from the nav, a docstring that cannot be read) fails it.
## NO_MKDOCS_2_WARNING silences the Material theme's notice about MkDocs 2.0 on every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/kayos bench storage --json

## Produce and consume through a local 3-node chain (acks=all, fsync on).
bench-produce: $(STAMP)
	$(BIN)/kayos bench produce --replicas 3 --json

## The Spark source against a local 3-node chain: 1,000,000 rows of 100 bytes (needs java).
bench-spark: $(SPARK_STAMP)
	$(BIN)/kayos bench spark --json

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .mypy_cache .ruff_cache
