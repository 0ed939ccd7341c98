# keyspread: `make run` serves on SQLite, `make test` runs every test.

CARGO  ?= cargo
PYTHON ?= python3
VENV   := .venv

.PHONY: run test test-deps fmt lint openapi bench fuzz fuzz-check

## Start the service on the embedded default (SQLite file keyspread.db, 127.0.0.1:8080).
run:
	$(CARGO) run --release -- serve

## Every test: unit, property, HTTP integration, the generated Python client, kinesalite.
## With KEYSPREAD_TEST_POSTGRES=postgres://user:pass@host/db (a server tests may create
## databases on), the HTTP suite runs a second time on Postgres, replicas included.
test: test-deps
	$(CARGO) test
	@if [ -n "$$KEYSPREAD_TEST_POSTGRES" ]; then \
		echo "--- the HTTP suite again, on Postgres"; \
		$(CARGO) test --test api; \
	else \
		echo "--- KEYSPREAD_TEST_POSTGRES is not set: Postgres runs skipped"; \
	fi

## What the tests drive besides Rust: a venv with openapi-python-client, and kinesalite.
test-deps: $(VENV)/.installed tests/kinesis/node_modules/.installed

$(VENV)/.installed: tests/python/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
	touch $@

tests/kinesis/node_modules/.installed: tests/kinesis/package.json tests/kinesis/package-lock.json
	npm ci --prefix tests/kinesis --omit=optional --no-audit --no-fund --loglevel=error
	touch $@

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

## Regenerate the committed OpenAPI document from the code.
openapi:
	$(CARGO) run --quiet -- openapi > openapi/openapi.json

## Release-build benchmarks of the allocation tree (time per operation, memory).
bench:
	$(CARGO) bench --bench tree
	$(CARGO) bench --bench memory

## Fuzz every target in turn for FUZZ_SECONDS each (nightly and cargo-fuzz; see docs/FUZZING.md),
## one process pinned to CPU FUZZ_CPU; new inputs go to fuzz/corpus/<target>.
FUZZ_SECONDS ?= 600
FUZZ_CPU     ?= 1
FUZZ_TARGETS ?= tree hash_key account_id list_shards csv_import

fuzz:
	cd fuzz && $(CARGO) +nightly fuzz build
	@for t in $(FUZZ_TARGETS); do \
		echo "--- fuzz $$t for $(FUZZ_SECONDS) s"; \
		(cd fuzz && taskset -c $(FUZZ_CPU) $(CARGO) +nightly fuzz run $$t -- \
			-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1) || exit 1; \
	done

## The fuzz targets still compile (stable is enough; no sanitizer): cheap enough for CI.
fuzz-check:
	$(CARGO) check --manifest-path fuzz/Cargo.toml --bins --locked
