"""[[dkim]] blocks: refused at load, with the file, line, key and key file named, when they
cannot sign or would sign what does not leave Pigeon."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.dkim.keys import generate_key, write_key
from pigeon.listener.tls import ensure_self_signed


def _config(tmp_path: Path, block: str, key: str = "rsa-sha256", extra: str = "") -> Path:
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    if not (keys / "k.pem").exists():
        write_key(keys / "k.pem", generate_key(key))  # type: ignore[arg-type]
    path = tmp_path / "pigeon.toml"
    path.write_text(f'{extra}\n[[dkim]]\ndomain = "example.com"\nselector = "s1"\n{block}\n')
    return path


def test_a_block_loads_with_its_key_path_relative_to_the_file(tmp_path: Path) -> None:
    config = load(_config(tmp_path, 'private_key = "keys/k.pem"\nname = "main"'))
    (block,) = config.dkim
    assert block.private_key == tmp_path / "keys" / "k.pem"
    assert (block.algorithm, block.canonicalization, block.over_sign) == ("rsa-sha256", "relaxed/relaxed", True)
    assert {"from", "to", "subject", "date", "message-id", "list-unsubscribe-post"} <= set(block.headers)


def test_a_missing_key_file_is_named(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/none.pem"')
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, line ") and "[[dkim]] #1 private_key" in message
    assert str(tmp_path / "keys" / "none.pem") in message and "cannot read" in message


def test_a_key_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/k.pem"\nalgorithm = "ed25519-sha256"')
    with pytest.raises(
        ConfigError, match=r"\[\[dkim\]\] #1 private_key: .*k\.pem holds an RSA key, not the Ed25519 key"
    ):
        load(path)


@pytest.mark.parametrize(
    ("block", "extra", "culprit"),
    [
        ('headers = ["from", "x-tenant"]', "", "'x-tenant' is Pigeon's own header"),
        ('over_sign = ["X-Campaign"]', "", "'X-Campaign' is Pigeon's own header"),
        ('headers = ["from", "x-customer"]', '[delivery]\ntenant_header = "X-Customer"', "'x-customer' is Pigeon's"),
    ],
)
def test_signing_an_internal_header_is_refused(tmp_path: Path, block: str, extra: str, culprit: str) -> None:
    path = _config(tmp_path, f'private_key = "keys/k.pem"\n{block}', extra=extra)
    with pytest.raises(ConfigError, match=culprit):
        load(path)


def test_a_header_list_without_from_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[\[dkim\]\] #1 headers: .*must include From"):
        load(_config(tmp_path, 'private_key = "keys/k.pem"\nheaders = ["subject"]'))


def test_two_blocks_with_one_name_are_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/k.pem"\nname = "a"')
    path.write_text(
        path.read_text() + '[[dkim]]\ndomain = "*"\nselector = "s2"\nprivate_key = "keys/k.pem"\nname = "a"\n'
    )
    with pytest.raises(ConfigError, match="two \\[\\[dkim\\]\\] blocks are called 'a'"):
        load(path)


def test_a_bad_selector_is_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/k.pem"')
    path.write_text(path.read_text().replace('selector = "s1"', 'selector = "s 1"'))
    with pytest.raises(ConfigError, match=r"\[\[dkim\]\] #1 selector"):
        load(path)


@pytest.mark.parametrize(
    ("written", "signed"),
    [
        ("bücher.example", "xn--bcher-kva.example"),
        ("Mail.Bücher.Example.", "mail.xn--bcher-kva.example"),
        ("straße.example", "xn--strae-oqa.example"),  # IDNA 2008, as every domain Pigeon reads
        ("esp.example", "esp.example"),
    ],
)
def test_a_signing_domain_is_taken_as_its_a_label(tmp_path: Path, written: str, signed: str) -> None:
    (block,) = load(_config(tmp_path, f'private_key = "keys/k.pem"\nsigning_domain = "{written}"')).dkim
    assert block.signing_domain == signed


@pytest.mark.parametrize("written", ["bad domain.example", "a..example", "ü" * 64 + ".example", "x" * 64 + ".example"])
def test_a_signing_domain_that_is_no_domain_name_is_refused_naming_it(tmp_path: Path, written: str) -> None:
    path = _config(tmp_path, f'private_key = "keys/k.pem"\nsigning_domain = "{written}"')
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == (
        f"{path}, line 6: [[dkim]] #1 signing_domain: [[dkim]] 'example.com' (selector s1): "
        f"{written!r} is not a domain name"
    )


SECOND_BLOCK = """
[smtp]
listen = ["127.0.0.1:2525"]

[[dkim]]
domain = "example.com"
selector = "a"
private_key = "keys/k.pem"

[[dkim]]
domain = "example.com"
selector = "b"
private_key = "keys/nope.pem"
"""


def test_a_problem_in_a_later_block_names_that_blocks_line(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/k.pem"')
    path.write_text(SECOND_BLOCK)  # line 13: the second block's private_key, not the first's (line 8)
    with pytest.raises(ConfigError, match=rf"^{path}, line 13: \[\[dkim\]\] #2 private_key: .*nope\.pem"):
        load(path)
    path.write_text(SECOND_BLOCK.replace('selector = "b"', 'selector = "b c"'))
    with pytest.raises(ConfigError) as caught:
        load(path)
    # In words, as `pigeon dkim keygen` says it, not as the regular expression it fails.
    assert str(caught.value) == (
        f"{path}, line 12: [[dkim]] #2 selector: selector 'b c' is not a DNS name "
        "(letters, digits, hyphens, dot-separated labels)"
    )
    path.write_text(SECOND_BLOCK.replace('selector = "b"', "selector = 7"))
    with pytest.raises(
        ConfigError, match=rf"^{path}, line 12: \[\[dkim\]\] #2 selector: expected a string, got a whole number"
    ):
        load(path)


TWICE = """
[[dkim]]
domain = "example.com"
selector = "s1"
private_key = "keys/k.pem"

[[dkim]]
name = "again"
domain = "Example.com"
selector = "{selector}"
private_key = "{key}"
{extra}
"""


@pytest.mark.parametrize("key", ["keys/k.pem", "keys/copy.pem"])
def test_a_second_block_that_would_add_the_same_signature_again_is_refused_naming_both_lines(
    tmp_path: Path, key: str
) -> None:
    path = _config(tmp_path, "")
    shutil.copy(tmp_path / "keys" / "k.pem", tmp_path / "keys" / "copy.pem")  # the same key, elsewhere
    path.write_text(TWICE.format(selector="S1", key=key, extra='headers = ["From", "Subject"]'))
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == (
        f"{path}, line 9: [[dkim]] #2 domain: [[dkim]] 'again' (selector S1): signs the same mail with the same key, "
        "domain and selector as the [[dkim]] block at line 2: a message carries that signature once, the first "
        "block's, so this one would never sign; remove one (another header list or canonicalization needs another "
        "selector)"
    )


@pytest.mark.parametrize(
    ("selector", "extra"), [("s1", 'tenant = "acme"'), ("s1", 'signing_domain = "esp.example"'), ("s2", "")]
)
def test_two_blocks_that_sign_other_mail_or_with_another_selector_both_load(
    tmp_path: Path, selector: str, extra: str
) -> None:
    path = _config(tmp_path, "")
    path.write_text(TWICE.format(selector=selector, key="keys/k.pem", extra=extra))
    assert len(load(path).dkim) == 2


ROUTES = """
[[route]]
domain = "a.example"
tls = "required"
tls_verify = true
ca_file = "ca.pem"

[[route]]
domain = "b.example"
{line}
"""


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (
            'tls = "always"',
            'line 10: [[route]] #2 tls: expected one of "opportunistic", "required", "disabled", "implicit",'
            ' got "always"',
        ),
        ('tls_verify = true\nca_file = "none.pem"', "line 11: [[route]] #2 ca_file: route 'b.example': CA file "),
        ('tls_verify = true\nca_file = "bad.pem"', "line 11: [[route]] #2 ca_file: route 'b.example': CA file "),
    ],
)
def test_a_problem_in_a_later_route_names_that_routes_line(tmp_path: Path, line: str, error: str) -> None:
    # The first block has the same keys, set right: the error is the second's, on its line.
    certificate, _ = ensure_self_signed(tmp_path / "certs", "smarthost.test")
    shutil.copy(certificate, tmp_path / "ca.pem")
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    path = tmp_path / "pigeon.toml"
    path.write_text(ROUTES.format(line=line))
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}, {error}"), caught.value


@pytest.mark.parametrize(("tenant", "culprit"), [("a b", " "), ("acme@corp", "@"), ("spring:acme", ":")])
def test_a_tenant_no_queue_could_have_is_refused_naming_its_line(tmp_path: Path, tenant: str, culprit: str) -> None:
    """As at every door: a tenant has no white space, ':' or '@' (a routing header's become '_')."""
    path = _config(tmp_path, f'private_key = "keys/k.pem"\ntenant = "{tenant}"')
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}, line 6: [[dkim]] #1 tenant: [[dkim]] 'example.com' (selector s1): ")
    assert str(caught.value).endswith(f"tenant {tenant!r} contains {culprit!r}: no white space, ':' or '@' allowed")
