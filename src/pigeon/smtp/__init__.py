"""Sans-IO SMTP: server and client state machines. Bytes in, events out; no sockets here."""
