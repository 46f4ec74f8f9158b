"""Property tests for the client session: whatever a server sends, in whatever pieces, the
session gives events or ClientProtocolError, nothing else, and never breaks the TLS policy.

The server's bytes are drawn from plausible replies (banners, EHLO offers with and without
STARTTLS, 354, 421, refusals, QUIT's 221) mixed with arbitrary bytes. The application side
answers as an I/O layer would: a message or QUIT when ready, a handshake that works or
fails when told to start TLS. With credentials (a smart host's route), AUTH never goes
without TLS, and no mail before the server took it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, target
from hypothesis import event as statistic
from hypothesis import strategies as st

from pigeon.smtp.client import ClientProtocolError, Envelope, Recipient
from pigeon.smtp.client_auth import Credentials
from pigeon.smtp.client_session import (
    NEED_DATA,
    ClientSession,
    Closed,
    Deliver,
    Phase,
    Quit,
    Ready,
    StartTls,
    TlsPolicy,
    TransactionDone,
    Unusable,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENVELOPE = Envelope("a@example.org", [Recipient("b@example.net"), Recipient("c@example.net")], b"x\r\n")

REPLIES = [
    b"220 mx.test ESMTP\r\n",
    b"220 2.0.0 go ahead\r\n",
    b"554 5.3.2 no service\r\n",
    b"250-mx.test\r\n250-PIPELINING\r\n250-CHUNKING\r\n250 STARTTLS\r\n",
    b"250-mx.test\r\n250 STARTTLS\r\n",
    b"250-mx.test\r\n250 SIZE 10\r\n",
    b"250 mx.test\r\n",
    b"250 2.1.0 ok\r\n",
    b"354 go\r\n",
    b"421 4.4.2 bye\r\n",
    b"454 4.7.0 no TLS\r\n",
    b"500 5.5.1 what\r\n",
    b"550 5.1.1 unknown\r\n",
    b"221 2.0.0 bye\r\n",
    b"250-mx.test\r\n250-STARTTLS\r\n250 AUTH PLAIN LOGIN\r\n",
    b"250-mx.test\r\n250 AUTH LOGIN\r\n",
    b"235 2.7.0 ok\r\n",
    b"334 VXNlcm5hbWU6\r\n",
    b"535 5.7.8 bad credentials\r\n",
]
CREDENTIALS = Credentials("user", "secret", ("PLAIN", "LOGIN"))
LOGIN_RESPONSES = (b"dXNlcg==\r\n", b"c2VjcmV0\r\n")  # base64 of "user", "secret"
PLAUSIBLE = {  # what a server might well answer in each phase of the client
    Phase.BANNER: [b"220 mx.test ESMTP\r\n", b"554 5.3.2 no service\r\n"],
    Phase.EHLO: [REPLIES[3], REPLIES[4], REPLIES[5], REPLIES[14], REPLIES[15], b"502 5.5.1 no EHLO\r\n"],
    Phase.AUTH: [b"235 2.7.0 ok\r\n", b"334 VXNlcm5hbWU6\r\n", b"535 5.7.8 bad credentials\r\n"],
    Phase.HELO: [b"250 mx.test\r\n", b"550 5.7.1 no\r\n"],
    Phase.STARTTLS: [b"220 2.0.0 go ahead\r\n", b"454 4.7.0 no TLS\r\n"],
    Phase.MAIL: [b"250 2.1.0 ok\r\n", b"354 go\r\n", b"550 5.1.1 unknown\r\n", b"451 4.3.0 later\r\n"],
    Phase.QUIT: [b"221 2.0.0 bye\r\n"],
}
COMMAND_VERBS = (b"EHLO ", b"HELO ", b"STARTTLS", b"AUTH ", b"MAIL ", b"RCPT ", b"DATA", b"BDAT ", b"RSET", b"QUIT")


@FUZZ
@given(data=st.data(), policy=st.sampled_from(TlsPolicy), authenticate=st.booleans())
def test_any_server_bytes_give_events_or_a_protocol_error_and_the_policy_holds(
    data: st.DataObject, policy: TlsPolicy, authenticate: bool
) -> None:
    session = ClientSession("client.test", tls=policy, credentials=CREDENTIALS if authenticate else None)
    written: list[bytes] = []
    tls_up = policy is TlsPolicy.IMPLICIT  # (the I/O layer's handshake came before the banner)
    mail_in_the_clear = False
    final = None

    def write(out: bytes) -> None:
        nonlocal mail_in_the_clear
        if out:
            assert final is None or out == b"QUIT\r\n", "written after the session closed"
            written.append(out)
            if b"MAIL FROM:" in out and not tls_up:
                mail_in_the_clear = True
            if out.startswith(b"AUTH ") or out in LOGIN_RESPONSES:
                assert authenticate and tls_up, "AUTH in the clear, or where the route has no credentials"
            if b"MAIL FROM:" in out and authenticate:
                assert session.auth_user == "user", "mail before the server took our AUTH"

    def server_says() -> list[bytes]:
        kind = data.draw(st.sampled_from(["plausible"] * 6 + ["any reply", "garbage", "eof"]))
        if kind == "eof":
            return [b""]
        if kind == "garbage":
            reply = data.draw(st.binary(min_size=1, max_size=24))
        elif kind == "any reply" or session.phase not in PLAUSIBLE:
            reply = data.draw(st.sampled_from(REPLIES))
        else:
            reply = data.draw(st.sampled_from(PLAUSIBLE[session.phase]))
        cut = data.draw(st.integers(min_value=0, max_value=len(reply)))
        return [part for part in (reply[:cut], reply[cut:]) if part]

    for _ in range(40):
        for piece in server_says():
            session.receive_data(piece)
            try:
                while True:
                    event = session.next_event()
                    if event is NEED_DATA:
                        break
                    if isinstance(event, (Closed, Unusable)):
                        final = final or event
                        break
                    if isinstance(event, StartTls):
                        assert policy is not TlsPolicy.DISABLED and policy is not TlsPolicy.IMPLICIT
                        if data.draw(st.booleans()):
                            session.tls_established()
                            tls_up = True
                        else:
                            session.tls_failed("handshake failure")
                    elif isinstance(event, (Ready, TransactionDone)):
                        if isinstance(event, Ready):
                            assert event.tls == tls_up
                            if policy is TlsPolicy.REQUIRED:
                                assert tls_up, "ready in the clear although TLS is required"
                        else:  # a recipient's outcome is a 2xx (delivered) or an error, never a 354
                            assert all(not 300 <= r.code < 400 for r in event.result.replies), event
                            if session.phase is Phase.CLOSED:  # a 421 ended it: Closed comes next
                                continue
                        write(session.send(Deliver(ENVELOPE) if data.draw(st.booleans()) else Quit()))
                    else:
                        raise AssertionError(f"not an event: {event!r}")
            except ClientProtocolError:
                assert session.phase is Phase.CLOSED
                assert session.data_to_send() == b""
                statistic("protocol error")
                return
            write(session.data_to_send())
            if final is not None:
                assert session.phase is Phase.CLOSED
                assert session.next_event() is final  # it keeps saying why
                break
        if final is not None:
            break

    statistic(f"ended in {session.phase.name}, TLS {tls_up}, {min(session.transactions, 3)}+ transactions")
    target(float(session.transactions))  # steer towards conversations that get far
    everything = b"".join(written)
    if policy is TlsPolicy.DISABLED:
        assert b"STARTTLS" not in everything
    if policy is TlsPolicy.REQUIRED:
        assert not mail_in_the_clear
    for out in written:
        assert out.startswith(COMMAND_VERBS) or out.endswith(b".\r\n") or out in LOGIN_RESPONSES, out
