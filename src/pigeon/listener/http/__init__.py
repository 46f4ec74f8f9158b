"""The HTTP listener: one module per endpoint, assembled by `app.py`."""
