"""Log records: one JSON object per event, one schema.

Every record has `type` (the event) and `timestamp` (Unix seconds, float, UTC). The other
fields depend on the type; absent optional fields are omitted, never written as null.

| field       | types                         | meaning                                                  |
|-------------|-------------------------------|----------------------------------------------------------|
| type        | all                           | `Reception`, `Rejection`, `Quarantine`, ...              |
| timestamp   | all                           | when the event happened                                  |
| node        | all                           | the node (host) name that wrote the record               |
| id          | Reception, Quarantine         | spool id, 16 hex digits                                  |
| session     | Reception, Rejection          | SMTP connection id, shared by all records of a connection|
| sender      | Reception, Rejection          | envelope sender ("" for the null sender)                 |
| recipients  | Reception, Rejection          | envelope recipients of this message / the refused one    |
| queue       | Reception                     | scheduled queue name, `campaign:tenant@domain`           |
| size        | Reception                     | bytes stored, `Received:` header included                |
| peer        | Reception, Rejection          | client address, `ip:port`                                |
| helo        | Reception, Rejection          | EHLO/HELO name the client gave                           |
| protocol    | Reception                     | RFC 3848 keyword: SMTP, ESMTP, ESMTPS, ESMTPA, ESMTPSA, UTF8SMTPS ... |
| tls         | Reception, Rejection          | TLS version and cipher, when the connection used TLS     |
| auth_user   | Reception, Rejection          | authenticated user                                       |
| command     | Rejection                     | the SMTP verb that was refused (MAIL, RCPT, DATA, ...)   |
| response    | Reception, Rejection          | `{code, enhanced, text}` of the reply Pigeon sent        |
| reason      | Quarantine                    | why a spool entry could not be read                      |
"""

from __future__ import annotations

import msgspec

from pigeon.smtp.replies import Reply


class Response(msgspec.Struct, omit_defaults=True):
    code: int
    text: str
    enhanced: str | None = None

    @classmethod
    def of(cls, reply: Reply) -> Response:
        return cls(reply.code, reply.text, reply.enhanced)


class Record(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    """Fields every record has."""

    timestamp: float
    node: str = ""


class Reception(Record, tag="Reception"):
    """A message was stored durably and the client was told 250."""

    id: str
    session: str
    sender: str
    recipients: list[str]
    queue: str
    size: int
    peer: str
    helo: str
    protocol: str
    response: Response
    tls: str | None = None
    auth_user: str | None = None


class Rejection(Record, tag="Rejection"):
    """Pigeon answered a client's command with a 4xx or 5xx reply."""

    session: str
    peer: str
    command: str
    response: Response
    helo: str | None = None
    sender: str | None = None
    recipients: list[str] | None = None
    tls: str | None = None
    auth_user: str | None = None


class Quarantine(Record, tag="Quarantine"):
    """A spool entry could not be read at start-up and was moved to quarantine."""

    id: str
    reason: str


AnyRecord = Reception | Rejection | Quarantine
RECORD_TYPES: tuple[type[Record], ...] = (Reception, Rejection, Quarantine)
