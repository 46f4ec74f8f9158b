"""The durable message store: group commit, recovery, quarantine."""
