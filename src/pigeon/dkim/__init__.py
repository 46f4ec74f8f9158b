"""DKIM signing (RFC 6376, RFC 8463): canonicalization, keys, signers, and signing off the loop."""
