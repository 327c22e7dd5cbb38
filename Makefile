# refract — fresh machine: `make demo`, `make test`. Both install what they need first.
SHELL := /bin/bash
CARGO ?= cargo
APT_PACKAGES := clang libbpf-dev bpftool haproxy wrk iproute2 curl fonts-dejavu-core procps pgbouncer pgpool2 python3-psycopg2 etcd-server protobuf-compiler
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build release test demo lint fmt bench clean conformance

# Installs missing Debian packages (idempotent: nothing happens when all are there).
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup) first"; exit 1; }
	@rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy 2>/dev/null || true

build: deps
	$(CARGO) build --workspace

release: deps
	$(CARGO) build --release -p refract

lint: deps
	$(CARGO) fmt --all -- --check
	@# No unused dependencies in any Cargo.toml of the tree (the fuzz crate and lab/ included);
	@# a false positive goes to its crate's [package.metadata.cargo-machete] ignored, with why.
	@command -v cargo-machete >/dev/null || $(CARGO) install cargo-machete --version 0.9.2 --locked
	$(CARGO) machete
	$(CARGO) clippy --profile ci --workspace --all-targets -- -D warnings
	@# The data-path-only binary (README, "Running it"): it compiles, and links no lab,
	@# plotters, ctrlc or PostgreSQL test kit.
	$(CARGO) clippy --profile ci -p refract --no-default-features -- -D warnings
	@if $(CARGO) tree -p refract --no-default-features -e normal,features | grep -E 'plotters|ctrlc|refract-lab|refract-testkit'; then \
	  echo "lint: refract --no-default-features pulls in the lab (above)"; exit 1; fi
	cd fuzz && $(CARGO) fmt -- --check && $(CARGO) clippy --release --all-targets --target-dir ../target -- -D warnings
	@# The layering (docs/architecture.md): the engine names no protocol, no hand-over and no
	@# front end; no front end depends on another.
	@if $(CARGO) tree -p refract-core -e normal | grep -E 'refract-(http|pg|handover|front|dispatch|agent|blob|lab)'; then \
	  echo "lint: refract-core depends on a protocol, the hand-over or a front end (above)"; exit 1; fi
	@if $(CARGO) tree -p refract-front-http -e normal | grep -E 'refract-(front-pg|pg|dispatch)'; then \
	  echo "lint: the HTTP front end depends on the PostgreSQL one (above)"; exit 1; fi
	@if $(CARGO) tree -p refract-front-pg -e normal | grep -E 'refract-(front-http|http |dispatch)'; then \
	  echo "lint: the PostgreSQL front end depends on the HTTP one (above)"; exit 1; fi
	@if $(CARGO) tree -p refract-shard -e normal | grep -E 'tokio|refract-(core|front|dispatch|handover)'; then \
	  echo "lint: refract-shard, sharding's arithmetic, is not pure (above)"; exit 1; fi

# Every test, the lab tests included (they need root and skip with a printed reason otherwise).
# --no-fail-fast: every test binary runs even when one fails, so one run shows every failure.
# The Python driver suites (crates/refract-dispatch/tests/it/pg_drivers.rs) need their venv first.
# Built in the `ci` profile (Cargo.toml): release optimisation without LTO, so the tests run
# optimised code without re-linking every dependency with LTO once per test binary.
# Then PostgreSQL's own regression suite through refract (`make conformance`).
test: lint
	tests/drivers/setup-python.sh
	$(CARGO) test --workspace --profile ci --no-fail-fast -- --test-threads=2
	cd fuzz && $(CARGO) test --release --target-dir ../target -- --test-threads=2
	CARGO=$(CARGO) tests/conformance/run.py

# PostgreSQL's regression suite (parallel_schedule of the installed server's exact version,
# from Debian's source package) directly, then through refract in transaction and in session
# pooling; fails on a test that passes directly but not through refract, unless
# tests/conformance/allow/ holds each hunk of its difference. Installs the server-dev headers and a
# deb-src entry when missing; outputs in target/conformance/run. docs/postgres.md, "Conformance".
conformance:
	CARGO=$(CARGO) tests/conformance/run.py

demo: release
	./target/release/refract demo

bench: release
	./target/release/refract bench sweep
	./target/release/refract bench sweep --rate none

fmt:
	$(CARGO) fmt --all
	cd fuzz && $(CARGO) fmt

clean:
	$(CARGO) clean

# Every driver suite of crates/refract-dispatch/tests/it/pg_drivers.rs (psycopg 3, psycopg2, asyncpg,
# SQLAlchemy, pgx v5, node-postgres, pgjdbc) through refract, and of pg_sharded_drivers.rs
# (asyncpg, psycopg 3, psycopg2, pgx v5 through sharded refract); installs the drivers first
# (PyPI, Go module proxy, npm, Maven Central; needs go, node/npm, mvn, JDK 17). See
# docs/postgres.md, "Drivers tested".
.PHONY: test-drivers
test-drivers:
	tests/drivers/setup-all.sh
	REFRACT_DRIVERS=all $(CARGO) test --release -p refract-dispatch --test it pg_drivers:: -- --nocapture
	REFRACT_DRIVERS=all $(CARGO) test --release -p refract-dispatch --test it pg_sharded_drivers:: -- --nocapture

# Coverage-guided fuzzing of the decoders under AFL++ (cargo-afl, stable Rust; installed if
# missing): every target in fuzz/ for FUZZ_SECONDS each, then executions and findings per
# target; fails on any crash or hang. `make test` replays the seeds and saved crashes instead
# (fuzz/tests/replay.rs): see docs/fuzzing.md for why.
FUZZ_SECONDS ?= 300
FUZZ_SMOKE_SECONDS ?= 8
.PHONY: fuzz fuzz-smoke
fuzz: deps
	fuzz/run.sh $(FUZZ_SECONDS)

# The same, a few seconds per target (under 60 s of fuzzing in all).
fuzz-smoke: deps
	fuzz/run.sh $(FUZZ_SMOKE_SECONDS)
