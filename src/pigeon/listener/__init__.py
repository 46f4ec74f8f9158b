"""Asyncio glue around the sans-IO protocols: the SMTP listener and the HTTP API."""
