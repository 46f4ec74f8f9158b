"""Configuration: the typed schema and the TOML loader."""
