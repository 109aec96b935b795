# spotorch: every target creates its own environment first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv beam-venv spark-venv demo test test-fast lint bench deploy destroy lock clean

# Your pipelines and settings: `spotorch init DIR` writes a starting project (DIR/pipelines,
# DIR/terraform.tfvars). There is no default: the examples name buckets that are not yours.
PIPELINES ?=
TFVARS ?=

# The local stack's BigQuery emulator (PyPI bqemulator: DuckDB and SQLGlot) in a venv of its own:
# it pins protobuf below what the Google clients in $(VENV) need. DuckDB is pinned with its
# spatial extension, which the emulator otherwise downloads at start (it cannot, offline);
# spotorch.local.bigquery copies the extension into the emulator's own HOME.
BQEMULATOR_VENV := $(VENV)/bqemulator
BQEMULATOR_PINS := bqemulator==1.4.0 duckdb==1.5.5 duckdb-extension-spatial==1.5.5 numpy

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(PYTHON) -m venv $(BQEMULATOR_VENV)
	$(BQEMULATOR_VENV)/bin/pip install --quiet $(BQEMULATOR_PINS)
	touch $(STAMP)

# Apache Beam for preprocess steps (issue 31), in an environment of its own: it pins protobuf
# below the main one's. The local Dataflow runs pipelines with its Python (about 70 s, 830 MB).
BEAM_VENV := .venv-beam
BEAM_STAMP := $(BEAM_VENV)/.installed

BEAM_REQUIREMENTS := deploy/dataflow-launcher/requirements.txt

$(BEAM_STAMP): $(BEAM_REQUIREMENTS)
	$(PYTHON) -m venv $(BEAM_VENV)
	$(BEAM_VENV)/bin/pip install --quiet --upgrade pip
	$(BEAM_VENV)/bin/pip install --quiet -r $(BEAM_REQUIREMENTS)
	touch $(BEAM_STAMP)

beam-venv: $(BEAM_STAMP)

# PySpark for Spark preprocess steps (issue 42), in an environment of its own: the local Dataproc
# runs each batch's driver with its Python, Spark in local mode on the machine's Java 17.
SPARK_VENV := .venv-spark
SPARK_STAMP := $(SPARK_VENV)/.installed
SPARK_REQUIREMENTS := deploy/spark-driver/requirements.txt

$(SPARK_STAMP): $(SPARK_REQUIREMENTS)
	$(PYTHON) -m venv $(SPARK_VENV)
	$(SPARK_VENV)/bin/pip install --quiet --upgrade pip
	$(SPARK_VENV)/bin/pip install --quiet -r $(SPARK_REQUIREMENTS)
	touch $(SPARK_STAMP)

spark-venv: $(SPARK_STAMP)

venv: $(STAMP) $(BEAM_STAMP) $(SPARK_STAMP)

demo: $(STAMP) $(BEAM_STAMP) $(SPARK_STAMP)  ## run the end-to-end demo on the local stack
	$(BIN)/spotorch demo

test: $(STAMP) $(BEAM_STAMP) $(SPARK_STAMP)  ## the whole suite: unit, contract, functions, end to end (Beam's and Spark's too)
	$(BIN)/python -m pytest

test-fast: $(STAMP)     ## unit tests only (no emulators)
	$(BIN)/python -m pytest -m "not emulator and not slow"

lint: $(STAMP)
	$(BIN)/ruff check shared functions tests trainer examples benchmarks deploy
	$(BIN)/mypy shared functions trainer benchmarks tests
	$(BIN)/lint-imports   # the layers contract in pyproject.toml [tool.importlinter]

bench: $(STAMP)         ## print the benchmark figures (policy, multi-region, search, events, cold start, scale)
	$(BIN)/python benchmarks/policy_bench.py
	$(BIN)/python benchmarks/multi_region_bench.py
	$(BIN)/python benchmarks/search_bench.py
	$(BIN)/python benchmarks/event_bench.py
	$(BIN)/python benchmarks/cold_start.py
	$(BIN)/python benchmarks/scale_bench.py --runs 100 --runs 1000

deploy:                 ## package functions + pipelines and terraform apply deploy/ (PIPELINES=dir; needs terraform, gcloud credentials)
	@test -n "$(PIPELINES)" || { echo "make deploy: set PIPELINES=path/to/your/pipelines (and TFVARS=path/to/terraform.tfvars); \`spotorch init DIR\` writes a starting project" >&2; exit 2; }
	@$(MAKE) --no-print-directory $(STAMP)
	PYTHON=$(BIN)/python PIPELINES=$(PIPELINES) TFVARS=$(TFVARS) deploy/deploy.sh apply

lock: $(STAMP)          ## pin the function bundle's dependencies (deploy/requirements.lock) to this venv's versions
	$(BIN)/python deploy/package.py --write-lock deploy/requirements.lock

destroy: $(STAMP)       ## remove what deploy created (keeps Firestore data and your buckets)
	PYTHON=$(BIN)/python TFVARS=$(TFVARS) deploy/deploy.sh destroy

clean:
	rm -rf $(VENV) $(BEAM_VENV) .pytest_cache .mypy_cache .ruff_cache
