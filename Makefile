# Shortcuts for the scripts (which are what the README documents: make may not be installed).
# ARGS go to the script: `make run ARGS="-c pigeon.toml"`, `make test ARGS="-k smuggling"`.
.PHONY: run test bench lint
ARGS ?=
run:
	./scripts/run $(ARGS)
test:
	./scripts/test $(ARGS)
bench:
	./scripts/bench $(ARGS)
lint:
	.venv/bin/ruff check src tests bench && .venv/bin/ruff format --check src tests bench && .venv/bin/mypy
