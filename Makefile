# keyspread: `make run` serves on SQLite, `make test` runs every test.

CARGO  ?= cargo
PYTHON ?= python3
VENV   := .venv

.PHONY: help run test proofs load-proof soak ha-drill test-deps rust-client mirror-producer crash fmt lint openapi bench bench-load bench-check fuzz fuzz-check

# `make` alone lists the targets; CI names the ones it runs.
.DEFAULT_GOAL := help

## List the targets with what each does, read from these `##` comments (`make` alone does too).
help:
	@echo 'make TARGET, where TARGET is one of:'
	@awk '/^## / { if (!open) doc = ""; doc = doc (doc == "" ? "" : "\n") substr($$0, 4); open = 1; next } \
		/^[a-zA-Z][a-zA-Z0-9_-]*:([^=]|$$)/ { \
			if (doc != "") { \
				n = split(doc, line, "\n"); \
				printf "  %-16s%s\n", substr($$1, 1, index($$1, ":") - 1), line[1]; \
				for (i = 2; i <= n; i++) printf "  %-16s%s\n", "", line[i]; \
			} \
			doc = ""; open = 0; next } \
		/^\t/ { doc = "" } \
		{ open = 0 }' $(firstword $(MAKEFILE_LIST))

## Start the service on the embedded default (SQLite file keyspread.db, 127.0.0.1:8080).
run:
	$(CARGO) run --release -- serve

## Every test: unit, property, HTTP integration, the generated Python, TypeScript and Rust
## clients, kinesalite; then the HTTP suite again on Postgres: the server
## KEYSPREAD_TEST_POSTGRES names, else a throwaway cluster when initdb and pg_ctl are here.
## Ends with what passed, failed and was skipped (and why); TEST_ARGS=FILTER runs fewer.
test:
	$(MAKE) --no-print-directory -j3 test-deps
	$(PYTHON) tests/run $(TEST_ARGS)

## The proofs one at a time, with their figures, on SQLite then on Postgres: ordering and
## leases on kinesalite, leases through three replicas, hot accounts on kinesalite, a reshard
## beside the anchors (scaling-utils' split, UNIFORM_SCALING; SQLite), the crash test, the
## closed loop on kinesalite at full length (three runs of 180 s, SQLite; writes
## docs/load_proof.svg), and the loop fed by producers' reports alone through an outside
## split and a reshard with the server killed (300 s, SQLite; writes docs/producers_proof.svg).
PROOFS := order_kinesis:: leases_kinesis:: leases_replicas:: fanout_kinesis:: anchors_kinesis:: crash:: load_kinesis:: producers_kinesis::

proofs:
	$(MAKE) --no-print-directory -j3 test-deps
	KEYSPREAD_PROOF_FULL=1 $(PYTHON) tests/run --api -- $(PROOFS) --nocapture --test-threads=1

## The closed loop on kinesalite at full length alone: MD5, keyspread without the loop and
## with it, three runs of 180 s (SQLite); writes docs/load_proof.svg.
load-proof: test-deps
	KEYSPREAD_PROOF_FULL=1 $(CARGO) test --test api load_kinesis -- --nocapture

## The failover drill, as root (a few minutes a mode): a highly available Postgres from
## Debian's packages, installed if missing (etcd, three Postgres nodes under Patroni,
## HAProxy: tests/ha/cluster.py), three replicas and a mirror under steady traffic, five
## failovers of each kind (a switchover, the leader's Postgres killed, the leader cut off),
## every answer judged by the history checker and the figures printed per kind; with
## synchronous replication, then asynchronous (HA_MODE=sync or async runs one).
HA_MODE ?= sync async
ha-drill:
	@command -v etcd >/dev/null && command -v patroni >/dev/null && command -v haproxy >/dev/null || \
		{ apt-get update -qq && apt-get install -y -q --no-install-recommends etcd-server patroni haproxy; }
	$(CARGO) build --locked --quiet --workspace --bins --tests
	for mode in $(HA_MODE); do \
		$(PYTHON) tests/ha/cluster.py --mode $$mode -- \
			$(CARGO) test --locked --test api history::a_failover_drill -- --ignored --nocapture || exit 1; \
	done

## The history checker for 10 minutes on each backend instead of `make test`'s 90 s: random
## operations through replica processes with faults, every answer judged against the event
## log. KEYSPREAD_HISTORY_SEED=N replays a run's choices.
soak:
	KEYSPREAD_HISTORY_SECS=600 $(PYTHON) tests/run --api -- history:: --nocapture

## The crash test alone, with its figures: 64 clients, SIGKILL at 20 random moments, then
## every acknowledged change checked in the database, key by key, on SQLite then on
## Postgres; KEYSPREAD_CRASH_SEED=N repeats a run's choices.
crash:
	$(PYTHON) tests/run --api -- crash:: --nocapture

## What the tests drive besides the service: a venv with openapi-python-client, kinesalite,
## the TypeScript client's tools (openapi-typescript, openapi-fetch, TypeScript 5), and the
## Rust client progenitor generates (built here, before the tests run beside it). `make test`
## makes them three at a time: the downloads and the two builds' serial stretches overlap.
test-deps: $(VENV)/.installed tests/kinesis/node_modules/.installed \
	examples/typescript/node_modules/.installed rust-client mirror-producer

$(VENV)/.installed: tests/python/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
	touch $@

tests/kinesis/node_modules/.installed: tests/kinesis/package.json tests/kinesis/package-lock.json
	npm ci --prefix tests/kinesis --omit=optional --no-audit --no-fund --loglevel=error
	touch $@

examples/typescript/node_modules/.installed: examples/typescript/package.json examples/typescript/package-lock.json
	npm ci --prefix examples/typescript --no-audit --no-fund --loglevel=error
	touch $@

## Build the Rust client progenitor generates (examples/rust) where tests/api/rust_client.rs runs it.
rust-client:
	$(CARGO) build --locked --quiet --manifest-path examples/rust/Cargo.toml \
		--target-dir $(or $(CARGO_TARGET_DIR),target)/rust-client

## Build the Rust producer of examples/mirror_producer (the mirror and the AWS SDK for Rust),
## which tests/api/mirror_kinesis.rs runs against kinesalite. Built with the workspace's
## binaries and tests, so the SDK's crates get the features `cargo test` gives them and are
## compiled once for all (without the tests' dev-dependencies' features, or alone, the
## producer would have them built a second time).
mirror-producer:
	$(CARGO) build --locked --quiet --workspace --bins --tests

## Format the code.
fmt:
	$(CARGO) fmt --all

## What CI checks first: formatting, clippy with every warning an error, and that the core
## crate builds alone, as the clients take it (without the server's OpenAPI schemas).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) check --quiet -p keyspread-keyspace

## Regenerate the committed OpenAPI documents from the code: 3.1, and its 3.0.3 rendition
## for generators that read 3.0 only.
openapi:
	$(CARGO) run --quiet -- openapi > openapi/openapi.json
	$(CARGO) run --quiet -- openapi --version 3.0 > openapi/openapi-3.0.json

## Every benchmark, one table at the end (~6 minutes after the build; the first run builds a
## 1M-account SQLite database, ~1 minute, cached in the target directory): the criterion
## benches of the allocation tree, then the load scripts (start-up, lookup, allocation
## against the database's own ceilings), the Python mirror's lookups in process next to
## GET /keys (100,000 accounts), and the Rust mirror at a million accounts (start,
## lookups, commit-to-mirror latency). KEYSPREAD_BENCH_POSTGRES=postgres://... adds
## Postgres. Needs wrk and taskset. See docs/BENCHMARKS.md.
BENCH_OUT := $(or $(CARGO_TARGET_DIR),target)

bench:
	$(CARGO) build --release
	$(CARGO) bench --bench tree
	$(CARGO) bench --bench memory > $(BENCH_OUT)/bench-memory.log; \
		status=$$?; cat $(BENCH_OUT)/bench-memory.log; exit $$status
	$(PYTHON) benches/load.py all --criterion $(BENCH_OUT)/criterion \
		--memory-log $(BENCH_OUT)/bench-memory.log --output $(BENCH_OUT)/bench-table.md
	$(PYTHON) benches/mirror.py --output $(BENCH_OUT)/bench-mirror.md
	$(PYTHON) benches/rust_mirror.py --output $(BENCH_OUT)/bench-rust-mirror.md

## The load scripts alone (~5 minutes): start-up, lookup, allocation and the ceilings.
bench-load:
	$(CARGO) build --release
	$(PYTHON) benches/load.py all --output $(BENCH_OUT)/bench-table.md

## Compile and link every benchmark without running it (for CI), in the debug profile whose
## dependencies `make test` builds anyway: a release build would compile the AWS SDK again,
## ten minutes of CI. `make bench` builds them in release.
bench-check:
	$(CARGO) build --benches

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
