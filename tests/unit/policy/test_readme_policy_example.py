"""The README's policy module (`# mypolicy.py` under "Policy hooks"), loaded as pasted: it shows
every hook, and answers ordinary mail as it means to. Found from outside: its `on_message` named
the AUTH user (`alice@example.com`, which `pigeon passwd` takes) and the X-Mailer-Campaign header
(`Spring Sale`) as they came, and a tenant or campaign with '@' or white space fails the hook:
every such message got `451 4.3.0`, which its client retries for days. And it made every
message's tenant of its AUTH user, so relayed mail naming its tenant (X-Tenant) left unsigned
by that tenant's blocks, and it added a List-Unsubscribe to a message that had one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pigeon.policy import Changes, Headers, MailFrom, ReceivedMessage, Refuse
from pigeon.policy.hooks import HOOKS, Policy
from tests.support.readme import readme_python


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    path = tmp_path / "mypolicy.py"
    path.write_text(readme_python("# mypolicy.py\n"))
    loaded = Policy(str(path))
    loaded.load()
    return loaded


def _message(auth_user: str | None, headers: bytes, tenant: str | None = None) -> ReceivedMessage:
    return ReceivedMessage(
        id="0000018c2f3a4b5c",
        listener="smtp",
        session="s1",
        peer_ip="192.0.2.1",
        helo="client.example.org",
        protocol="ESMTPSA",
        tls="TLSv1.3",
        auth_user=auth_user,
        sender="alice@example.com",
        recipients=("bob@example.net",),
        size=100,
        headers=Headers(b"From: alice@example.com\r\n" + headers + b"Subject: hi\r\n\r\n"),
        tenant=tenant,
        campaign=None,
    )


def _on_message(policy: Policy, message: ReceivedMessage) -> Any:
    async def ask() -> Any:
        assert policy.on_message is not None
        verdict = policy.on_message(message)
        return await verdict if isinstance(verdict, asyncio.Future) else verdict

    return asyncio.run(ask())


def test_the_example_shows_every_hook(policy: Policy) -> None:
    assert policy.defined() == list(HOOKS)


def test_an_auth_user_with_an_at_sign_and_a_campaign_with_a_space_make_a_tenant_and_a_campaign(
    policy: Policy,
) -> None:
    answer = _on_message(policy, _message("alice@example.com", b"X-Mailer-Campaign: Spring Sale\r\n"))
    assert isinstance(answer, Changes), answer  # not HookFailed: 451 4.3.0 to the client
    assert (answer.tenant, answer.campaign) == ("alice", "Spring_Sale")
    assert answer.add_headers == [("List-Unsubscribe", "<mailto:unsub@alice.example>")]


@pytest.mark.parametrize(
    ("auth_user", "campaign", "tenant", "made"),
    [
        (None, None, "anonymous", None),  # no AUTH, no campaign header
        ("acme", "  ", "acme", None),  # a campaign of white space alone is none
        ("@example.com", "inbound", "anonymous", None),  # the [[inbound]] routes' campaign is no one else's
        ("globex", "Q3: launch @ 9", "globex", "Q3_launch_9"),
        ("élodie@example.fr", "x" * 300, "lodie", "x" * 64),
    ],
)
def test_the_example_answers_any_user_and_campaign_with_names_a_queue_takes(
    policy: Policy, auth_user: str | None, campaign: str | None, tenant: str, made: str | None
) -> None:
    header = b"" if campaign is None else f"X-Mailer-Campaign: {campaign}\r\n".encode()
    answer = _on_message(policy, _message(auth_user, header))
    assert isinstance(answer, Changes), answer
    assert (answer.tenant, answer.campaign) == (tenant, made)


def test_mail_naming_its_tenant_keeps_it_and_so_that_tenants_signers(policy: Policy) -> None:
    """Relayed mail with `X-Tenant: acme` (no AUTH user) stays acme's, signed by acme's
    blocks: not made "anonymous", which no [[dkim]] block signs."""
    answer = _on_message(policy, _message(None, b"X-Tenant: acme\r\n", tenant="acme"))
    assert isinstance(answer, Changes), answer
    assert (answer.tenant, answer.dkim) == ("acme", ["acme-rsa", "acme-ed25519"])
    answer = _on_message(policy, _message("globex", b"X-Tenant: initech\r\n", tenant="initech"))
    assert isinstance(answer, Changes), answer
    assert (answer.tenant, answer.dkim) == ("initech", None)  # initech's own blocks, by author domain


def test_a_message_with_its_own_list_unsubscribe_gets_no_second_one(policy: Policy) -> None:
    own = b"list-unsubscribe: <https://alice.example/u/1>\r\n"  # any case
    answer = _on_message(policy, _message("alice", own))
    assert isinstance(answer, Changes), answer
    assert answer.add_headers == []
    answer = _on_message(policy, _message("alice", b""))
    assert isinstance(answer, Changes), answer
    assert answer.add_headers == [("List-Unsubscribe", "<mailto:unsub@alice.example>")]


def test_the_mail_from_example_refuses_the_blocked_domain_only(policy: Policy) -> None:
    def mail(sender: str) -> MailFrom:
        return MailFrom(
            session="s1",
            peer_ip="192.0.2.1",
            helo="h",
            sender=sender,
            size=None,
            smtputf8=False,
            tls=None,
            auth_user=None,
        )

    assert policy.on_mail_from is not None
    refused = policy.on_mail_from(mail("x@Spam.Example"))
    assert isinstance(refused, Refuse) and refused.code == 550
    assert policy.on_mail_from(mail("alice@example.com")) is None
    assert policy.on_mail_from(mail("")) is None  # the null sender
