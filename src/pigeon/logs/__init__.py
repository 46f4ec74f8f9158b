"""Event records (one JSON schema) and the rotating, compressed files they are written to."""
