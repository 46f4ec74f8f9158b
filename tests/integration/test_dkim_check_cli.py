"""`pigeon dkim check`: each configured key against its published record, asked of the
node's own resolver (a DNS of the test's on loopback), one line per selector and an exit
status a cron job can act on."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pigeon.dkim.keys import PrivateKey, generate_key, pem, record_text
from tests.support import zygote
from tests.support.dns import DnsServer, Zone

RSA = generate_key("rsa-sha256", 1024)
OTHER_RSA = generate_key("rsa-sha256", 1024)
ED = generate_key("ed25519-sha256")
OTHER_ED = generate_key("ed25519-sha256")


def pigeon_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return zygote.run([*args], text=True, cwd=cwd, timeout=60)


def configure(tmp_path: Path, dns: DnsServer, blocks: list[tuple[str, str, PrivateKey]], extra: str = "") -> Path:
    """A configuration with a [[dkim]] block per (domain, selector, key) and the test's DNS."""
    text = f'[dns]\nnameservers = ["{dns.endpoint}"]\ntimeout = "2s"\n'
    for index, (domain, selector, key) in enumerate(blocks):
        path = tmp_path / f"key{index}.pem"
        path.write_bytes(pem(key))
        algorithm = "rsa-sha256" if key in (RSA, OTHER_RSA) else "ed25519-sha256"
        text += f'\n[[dkim]]\ndomain = "{domain}"\nselector = "{selector}"\nprivate_key = "{path.name}"\n'
        text += f'algorithm = "{algorithm}"\n{extra}'
    config = tmp_path / "pigeon.toml"
    config.write_text(text)
    return config


def lines_by_name(stdout: str) -> dict[str, str]:
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in stdout.splitlines()}


def test_check_says_ok_only_for_a_key_the_dns_publishes_rsa_and_ed25519(tmp_path: Path) -> None:
    zone = Zone(
        records={
            "rsa._domainkey.example.com": [("TXT", "some other text"), ("TXT", record_text(RSA))],
            # Written as people do: white space in p=, tags in another order, h= and s= lists.
            "ed._domainkey.example.com": [("TXT", f"v=DKIM1; p={record_text(ED).split('p=')[1][:20]} "
                                                  f"{record_text(ED).split('p=')[1][20:]} ; k=ed25519; "
                                                  "h=sha1 : sha256; s=email")],
        }
    )  # fmt: skip
    with DnsServer(zone) as dns:
        config = configure(tmp_path, dns, [("example.com", "rsa", RSA), ("example.com", "ed", ED)])
        result = pigeon_cli("dkim", "check", "-c", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = lines_by_name(result.stdout)
    assert lines["rsa._domainkey.example.com"].startswith("ok: k=rsa")
    assert lines["ed._domainkey.example.com"].startswith("ok: k=ed25519")
    assert ("rsa._domainkey.example.com", "TXT") in zone.queries  # asked of the configured DNS


def test_check_names_each_key_the_dns_does_not_publish_and_exits_1(tmp_path: Path) -> None:
    zone = Zone(
        records={
            "rsa._domainkey.example.com": [("TXT", record_text(OTHER_RSA))],  # the file was replaced
            "ed._domainkey.example.com": [("TXT", record_text(OTHER_ED))],
            "old._domainkey.example.com": [("TXT", "v=DKIM1; k=rsa; p=")],
            "kind._domainkey.example.com": [("TXT", record_text(RSA))],  # an RSA record for an Ed25519 key
            "empty._domainkey.example.com": [("A", "192.0.2.1")],
        }
    )
    blocks = [
        ("example.com", "rsa", RSA),
        ("example.com", "ed", ED),
        ("example.com", "old", RSA),
        ("example.com", "kind", ED),
        ("example.com", "gone", RSA),
        ("example.com", "empty", ED),
    ]
    with DnsServer(zone) as dns:
        result = pigeon_cli("dkim", "check", "-c", str(configure(tmp_path, dns, blocks)), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = lines_by_name(result.stdout)
    assert lines["rsa._domainkey.example.com"].startswith("MISMATCH: the DNS publishes another key")
    assert lines["ed._domainkey.example.com"].startswith("MISMATCH: the DNS publishes another key")
    assert lines["old._domainkey.example.com"].startswith("revoked: ")
    assert lines["kind._domainkey.example.com"].startswith("algorithm mismatch: the record says k=rsa")
    assert lines["gone._domainkey.example.com"].startswith("no record: gone._domainkey.example.com does not exist")
    assert lines["empty._domainkey.example.com"].startswith("no record: the name has no TXT record")
    assert str(tmp_path / "key0.pem") in lines["rsa._domainkey.example.com"]  # which file to look at


def test_check_names_the_tag_of_a_record_verifiers_ignore_says_what_to_publish_and_exits_1(tmp_path: Path) -> None:
    # Each record holds the right key; one tag makes verifiers (opendkim, dkimpy) pass it over,
    # so mail signed with the key fails verification.
    key = record_text(RSA).split("p=")[1]
    zone = Zone(
        records={
            "hash._domainkey.example.com": [("TXT", f"v=DKIM1; h=sha1; k=rsa; p={key}")],
            "service._domainkey.example.com": [("TXT", f"v=DKIM1; s=other; k=rsa; p={key}")],
            "case._domainkey.example.com": [("TXT", f"v=DKIM1; k=RSA; p={key}")],
            "twice._domainkey.example.com": [("TXT", f"v=DKIM1; k=rsa; p={key}; p={key}")],
            "edcase._domainkey.example.com": [("TXT", record_text(ED).replace("k=ed25519", "k=Ed25519"))],
        }
    )
    blocks = [("example.com", name, RSA) for name in ("hash", "service", "case", "twice")]
    blocks.append(("example.com", "edcase", ED))
    with DnsServer(zone) as dns:
        result = pigeon_cli("dkim", "check", "-c", str(configure(tmp_path, dns, blocks)), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = lines_by_name(result.stdout)
    assert lines["hash._domainkey.example.com"].startswith(
        "unusable record: h=sha1 leaves out sha256, the hash the signatures use: publish h=sha256, or no h="
    )
    assert lines["service._domainkey.example.com"].startswith(
        "unusable record: s=other leaves out email: publish s=email, or no s="
    )
    assert lines["case._domainkey.example.com"].startswith(
        "unusable record: k=RSA is no key type (tag values are case-sensitive): publish k=rsa"
    )
    assert lines["edcase._domainkey.example.com"].startswith(
        "unusable record: k=Ed25519 is no key type (tag values are case-sensitive): publish k=ed25519"
    )
    assert lines["twice._domainkey.example.com"].startswith(
        "unusable record: p= is given twice, which makes the record invalid: publish each tag once"
    )


def test_check_calls_a_record_with_a_part_that_is_no_tag_or_a_late_v_unusable_and_exits_1(tmp_path: Path) -> None:
    # Each record holds the right key. A part that is no tag=value (RFC 6376 3.2) makes dkimpy and
    # OpenDKIM refuse the record; a v= after another tag breaks RFC 6376 3.6.1 (v= first), which
    # strict verifiers enforce. A ";" at the end and white space around tags are fine.
    key = record_text(RSA).split("p=")[1]
    zone = Zone(
        records={
            "bogus._domainkey.example.com": [("TXT", f"v=DKIM1; k=rsa; bogus; p={key}")],
            "empty._domainkey.example.com": [("TXT", f"v=DKIM1;; k=rsa; p={key}")],
            "late._domainkey.example.com": [("TXT", f"k=rsa; v=DKIM1; p={key}")],
            "fine._domainkey.example.com": [("TXT", f" v=DKIM1 ;k = rsa ;  p={key} ; ")],
            "end._domainkey.example.com": [("TXT", f"v=DKIM1; k=rsa; p={key};")],
        }
    )
    blocks = [("example.com", name, RSA) for name in ("bogus", "empty", "late", "fine", "end")]
    with DnsServer(zone) as dns:
        result = pigeon_cli("dkim", "check", "-c", str(configure(tmp_path, dns, blocks)), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = lines_by_name(result.stdout)
    assert lines["bogus._domainkey.example.com"].startswith(
        'unusable record: "bogus" is no tag=value, which makes the record invalid: take it out, '
        "or write it as tag=value"
    )
    assert lines["empty._domainkey.example.com"].startswith(
        'unusable record: an empty part (";;") makes the record invalid: publish one ";" between two tags'
    )
    assert lines["late._domainkey.example.com"].startswith(
        "unusable record: v=DKIM1 comes after another tag, and v= must be first: publish v=DKIM1 first, or no v="
    )
    assert lines["fine._domainkey.example.com"].startswith("ok: k=rsa")
    assert lines["end._domainkey.example.com"].startswith("ok: k=rsa")


def test_check_exits_75_when_a_lookup_fails_and_says_so(tmp_path: Path) -> None:
    zone = Zone(
        records={"rsa._domainkey.example.com": [("TXT", record_text(RSA))]}, servfail={"ed._domainkey.example.com"}
    )
    with DnsServer(zone) as dns:
        config = configure(tmp_path, dns, [("example.com", "rsa", RSA), ("example.com", "ed", ED)])
        result = pigeon_cli("dkim", "check", "-c", str(config), cwd=tmp_path)
    assert result.returncode == 75, result.stdout + result.stderr
    lines = lines_by_name(result.stdout)
    assert lines["rsa._domainkey.example.com"].startswith("ok: ")
    assert lines["ed._domainkey.example.com"].startswith("lookup failed: ") and "SERVFAIL" in result.stdout


def test_a_glob_block_is_checked_as_its_signing_domain_or_the_domain_given(tmp_path: Path) -> None:
    zone = Zone(
        records={
            "s._domainkey.signer.example": [("TXT", record_text(RSA))],
            "g._domainkey.customer.example": [("TXT", record_text(ED))],
        }
    )
    with DnsServer(zone) as dns:
        config = configure(tmp_path, dns, [("*", "g", ED)])
        result = pigeon_cli("dkim", "check", "-c", str(config), cwd=tmp_path)
        assert result.returncode == 1 and "not checked" in result.stdout and "--domain" in result.stdout
        given = pigeon_cli("dkim", "check", "-c", str(config), "--domain", "Customer.Example", cwd=tmp_path)
        assert given.returncode == 0, given.stdout + given.stderr
        assert lines_by_name(given.stdout)["g._domainkey.customer.example"].startswith("ok: ")
        signing = configure(tmp_path, dns, [("*.example", "s", RSA)], extra='signing_domain = "signer.example"\n')
        result = pigeon_cli("dkim", "check", "-c", str(signing), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines_by_name(result.stdout)["s._domainkey.signer.example"].startswith("ok: ")
