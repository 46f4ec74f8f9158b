"""The node: builds every room from the configuration, starts them, and stops them in order."""
