"""Pigeon: a Mail Transfer Agent for high-volume senders and mail-receiving applications."""

__version__ = "0.1.0"
