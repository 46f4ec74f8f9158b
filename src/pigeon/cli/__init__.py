"""The `pigeon` command."""
