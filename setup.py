"""Pigeon's compiled parts, each with a pure-Python fallback:

* `pigeon.smtp._scan` (`_scan.c`): the byte scans of `pigeon.smtp.framing`;
* `pigeon.inbound.targets._maildir` (`_maildir.c`): the Maildir target's file work for a batch,
  in one release of the GIL;
* the modules every message runs through (`COMPILED`: SMTP reception and intake, the SMTP
  client and delivery, settlement, group commit, the spool and the scheduler), compiled by
  mypyc from the same Python source. Measured against the same tree in Python, one run each:
  `bench/relay.py` at 5 KiB 1.21x the rate at 0.83x the CPU a message, at 50 KiB 1.19x at
  0.79x; `bench/accept.py` at 5 KiB 1.17x at 0.78x. Adding the spool and the scheduler then
  took 0.91-0.93x the CPU a relayed 5 KiB message (two runs on a busy machine).

Not every module compiles as it is: mypyc takes no lambda as a default argument, no class
attribute read through the class unless it is a `ClassVar` (`SpoolError.reply`), no surrogate
in a string literal, no subclass of OSError, and it compiles `msgspec.Struct` subclasses into
classes msgspec cannot read (`pigeon.message` stays Python). A failed build falls back to
Python for all of them, which `./scripts/test` refuses.

Optional: without a C compiler the install still succeeds, and Pigeon uses its Python versions
(same answers, slower). `PIGEON_PURE_PYTHON=1 pip install ...` builds none of the mypyc ones
(to profile those modules with py-spy, which sees into Python code only). Everything else about
the package is in pyproject.toml.
"""

import os
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "src/pigeon/smtp/server.py",
    "src/pigeon/smtp/replies.py",
    "src/pigeon/smtp/extensions.py",
    "src/pigeon/smtp/address.py",
    "src/pigeon/smtp/framing.py",
    "src/pigeon/header_section.py",
    "src/pigeon/listener/smtp.py",
    "src/pigeon/intake.py",
    "src/pigeon/delivery/dispatcher.py",
    "src/pigeon/delivery/session.py",
    "src/pigeon/delivery/smtp_agent.py",
    "src/pigeon/smtp/client.py",
    "src/pigeon/smtp/client_session.py",
    "src/pigeon/queue/ready.py",
    "src/pigeon/queue/settlement.py",
    "src/pigeon/spool/commit.py",
    "src/pigeon/spool/spool.py",
    "src/pigeon/spool/sqlite.py",
    "src/pigeon/spool/reserve.py",
    "src/pigeon/queue/scheduler.py",
]


_BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def _compiled() -> list[Extension]:
    if os.environ.get("PIGEON_PURE_PYTHON") or not _BUILDS & set(sys.argv[1:]):
        return []  # (pip also runs this file for the package's metadata: no need to compile then)
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    # pip builds in an environment of its own, with mypy but without Pigeon's dependencies:
    # their types are unknown (Any) here, which costs only speed at those calls, and what
    # mypy says of code that uses them is not this build's business (the type check is
    # `mypy`'s, with the project's strict settings).
    with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as config:
        config.write("[mypy]\nignore_missing_imports = True\nignore_errors = True\n")
    try:
        extensions: list[Extension] = mypycify(["--config-file", config.name, *COMPILED])
    except BaseException as error:  # mypycify exits (SystemExit) on a type error
        print(f"pigeon: building without the mypyc-compiled modules: {error!r}")
        _forget_earlier_builds()
        return []
    finally:
        os.unlink(config.name)
    return [_Compiled.mark(extension) for extension in extensions]


def _forget_earlier_builds() -> None:
    """Delete what an earlier in-place build (`pip install -e`) compiled from `COMPILED`: Python
    imports a module's extension before its source, so after this build failed an edited
    module would otherwise run as it was before the edit."""
    for source in COMPILED:
        module = Path(source)
        for built in module.parent.glob(f"{module.stem}.*.so"):
            built.unlink(missing_ok=True)
    for shared in Path("src").glob("*__mypyc.*.so"):
        shared.unlink(missing_ok=True)


class _Compiled(build_ext):
    """Builds mypyc's extensions all or none: they share one library (mypycify's first
    extension), and a module built without it would be installed and fail at import; with
    none built, Python imports each module's source."""

    _ALL_OR_NONE = "_pigeon_mypyc"

    @classmethod
    def mark(cls, extension: Extension) -> Extension:
        setattr(extension, cls._ALL_OR_NONE, True)
        return extension

    def build_extension(self, ext: Extension) -> None:
        if not getattr(ext, self._ALL_OR_NONE, False):
            super().build_extension(ext)
            return
        if getattr(self, "_pigeon_failed", False):
            return
        try:
            super().build_extension(ext)
        except Exception as error:  # a compiler error (CompileError, LinkError) or a missing compiler
            self._pigeon_failed = True
            print(f"pigeon: building without the mypyc-compiled modules: {error}")
            for built in self.extensions:
                if getattr(built, self._ALL_OR_NONE, False):
                    Path(self.get_ext_fullpath(built.name)).unlink(missing_ok=True)


setup(
    cmdclass={"build_ext": _Compiled},
    ext_modules=[
        Extension("pigeon.smtp._scan", ["src/pigeon/smtp/_scan.c"], optional=True),
        Extension("pigeon.inbound.targets._maildir", ["src/pigeon/inbound/targets/_maildir.c"], optional=True),
        *_compiled(),
    ],
)
