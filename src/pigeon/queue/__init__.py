"""Queues: names, the message state machine, the scheduler and ready queues."""
