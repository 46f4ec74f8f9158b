# Shortcuts for the scripts (which are what the README documents: make may not be installed).
.PHONY: run test bench lint
run:
	./scripts/run
test:
	./scripts/test
bench:
	./scripts/bench
lint:
	.venv/bin/ruff check src tests bench && .venv/bin/ruff format --check src tests bench && .venv/bin/mypy
