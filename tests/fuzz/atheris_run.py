"""Runs one coverage-guided fuzz target under atheris (libFuzzer) in this process.

    python -m tests.fuzz.atheris_run smtp_server -max_total_time=60 -artifact_prefix=crashes/

The target is a module of `tests.fuzz.targets` with `check(data: bytes) -> None`, which must
return for every input: an exception (or an assertion about what the code promised) is a
crash, and libFuzzer writes the input that caused it. Pigeon's modules are instrumented for
coverage as the target imports them; everything else is not, so the fuzzer steers by
Pigeon's branches only.
"""

from __future__ import annotations

import importlib
import sys

import atheris


def main(argv: list[str]) -> None:
    name, options = argv[1], argv[2:]
    with atheris.instrument_imports(include=["pigeon"]):
        target = importlib.import_module(f"tests.fuzz.targets.{name}")
    atheris.Setup([argv[0], *options], target.check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
