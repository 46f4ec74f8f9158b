"""Inbound routing: mail for applications, from IMAP mailboxes or the SMTP listener, handed to
their targets (Sidekiq, webhook, PostgreSQL, Maildir, log) exactly once per message, as far as
the application can tell: at-least-once handoff, a claim per message among the nodes, and a
dedupe key with every handoff so the application can drop what a crash made it see twice."""
