"""The one compiled part of Pigeon: the byte scans of `pigeon.smtp.framing` (`_scan.c`).

Optional: without a C compiler the install still succeeds, and framing.py uses its Python
scans (same answers, slower). Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("pigeon.smtp._scan", ["src/pigeon/smtp/_scan.c"], optional=True)])
