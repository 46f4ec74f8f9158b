"""Outbound delivery: routes and MX, the SMTP client connections, dispatching, bounce
classification and delivery status notifications."""
