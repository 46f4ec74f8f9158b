"""Fuzz targets: each module has `check(data: bytes) -> None`, for atheris (`atheris_run`)
and for the regression tests that replay what it found."""
