"""Pigeon's two compiled parts, each with a pure-Python fallback:

* `pigeon.smtp._scan` (`_scan.c`): the byte scans of `pigeon.smtp.framing`;
* `pigeon.inbound.targets._maildir` (`_maildir.c`): the Maildir target's file work for a batch,
  in one release of the GIL.

Optional: without a C compiler the install still succeeds, and Pigeon uses its Python versions
(same answers, slower). Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("pigeon.smtp._scan", ["src/pigeon/smtp/_scan.c"], optional=True),
        Extension("pigeon.inbound.targets._maildir", ["src/pigeon/inbound/targets/_maildir.c"], optional=True),
    ]
)
