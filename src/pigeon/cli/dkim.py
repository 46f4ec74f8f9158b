"""`pigeon dkim keygen`: make a DKIM key, and print its DNS record and its `[[dkim]]` block;
`pigeon dkim check`: whether each configured key is the one its DNS record publishes."""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pigeon.cli.common import add_config_option, load_config

if TYPE_CHECKING:
    from pigeon.config.schema import Config

EXAMPLES = """examples:
  pigeon dkim keygen --domain example.com --selector s2025
  pigeon dkim keygen --domain example.com --selector ed2025 --algorithm ed25519-sha256
  pigeon dkim keygen --domain example.com --selector big --bits 3072 --out /etc/pigeon/dkim/big.pem
  pigeon dkim check -c /etc/pigeon/pigeon.toml
Publish the TXT record, add the block to the configuration, check, then `kill -HUP` the node.
"""

EX_TEMPFAIL: Final = 75  # (sysexits.h) a lookup failed: asking again later may answer


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "dkim",
        help="DKIM keys: `pigeon dkim keygen`",
        description="DKIM signing keys.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    keygen = actions.add_parser(
        "keygen",
        help="make a key, print its DNS record and [[dkim]] block",
        description="Write a new private key (PEM, mode 0600) and print the TXT record to publish "
        "and the [[dkim]] block to add to the configuration.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    keygen.add_argument("--domain", required=True, help="the signing domain (d=)")
    keygen.add_argument("--selector", required=True, help="the selector (s=): the key is at <selector>._domainkey")
    keygen.add_argument("--algorithm", choices=("rsa-sha256", "ed25519-sha256"), default="rsa-sha256")
    keygen.add_argument("--bits", type=int, help="RSA key size (default 2048; 1024 to 4096); not for Ed25519")
    keygen.add_argument("--out", type=Path, help="key file to write (default: <domain>.<selector>.pem here)")
    keygen.set_defaults(run=run)
    check = actions.add_parser(
        "check",
        help="compare each [[dkim]] key with its published DNS record",
        description="For each [[dkim]] block, look up <selector>._domainkey.<domain> TXT through the "
        "configured resolver ([dns] nameservers) and compare the published key with the configured one. "
        "Exit 0: every key is published; 1: a key is not (mismatch, revoked, no record, algorithm "
        "mismatch, a record verifiers pass over, or a block that could not be checked); "
        f"{EX_TEMPFAIL}: a lookup failed (try again).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(check)
    check.add_argument(
        "--domain",
        help="check only the blocks that sign this author domain's mail, as this domain "
        "(a glob block without signing_domain can be checked only so)",
    )
    check.set_defaults(run=run_check)


def run(args: argparse.Namespace) -> int:
    # Imported here, not with the module: every `pigeon` command (`pigeon serve` too) builds
    # the parser that registers this one, and `cryptography` would add some 20 ms to each.
    from pigeon.dkim.keys import dns_record, generate_key, name_problem, write_key
    from pigeon.smtp.address import a_label

    # An internationalised name is published, and given as d=, as its A-label (the form DNS
    # knows it by), as a [[dkim]] block's domain is read.
    domain = a_label(args.domain.strip().rstrip("."))
    for problem in (name_problem("--domain", domain), name_problem("--selector", args.selector)):
        if problem is not None:
            print(f"pigeon: {problem}", file=sys.stderr)
            return 2
    if args.bits is not None and args.algorithm == "ed25519-sha256":
        # An Ed25519 key has one size: a --bits given for it is a mistake to name, not to ignore.
        print("pigeon: --bits is for RSA keys; an Ed25519 key has no size to choose", file=sys.stderr)
        return 2
    bits = 2048 if args.bits is None else args.bits
    if not 1024 <= bits <= 4096:
        print("pigeon: --bits must be from 1024 to 4096 (verifiers refuse less, DNS strains at more)", file=sys.stderr)
        return 2
    out: Path = args.out if args.out is not None else Path(f"{domain}.{args.selector}.pem")
    key = generate_key(args.algorithm, bits)
    try:
        write_key(out, key)
    except FileExistsError:
        print(f"pigeon: {out} exists; not replaced (choose another --out, or remove it)", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"pigeon: cannot write {out}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"; the private key is in {out.resolve()} (mode 0600): keep it readable by the user Pigeon runs as")
    print(f"; publish in the DNS zone of {domain}:")
    print(dns_record(domain, args.selector, key))
    print()
    print("# add to the Pigeon configuration, then send the node SIGHUP:")
    print("[[dkim]]")
    print(f'domain = "{domain}"')
    print(f'selector = "{args.selector}"')
    print(f'private_key = "{out.resolve()}"')
    print(f'algorithm = "{args.algorithm}"')
    return 0


def run_check(args: argparse.Namespace) -> int:
    """`pigeon dkim check`: one line per key and the name it is published at."""
    config = load_config(args)
    from pigeon.smtp.address import a_label

    domain = a_label(args.domain.strip().rstrip(".")).lower() if args.domain else None
    return asyncio.run(_check(config, domain))


async def _check(config: Config, domain: str | None) -> int:
    # Imported here: see `run`.
    from pigeon.delivery.mx import Resolver
    from pigeon.dkim.keys import load_key, public_value
    from pigeon.dkim.published import Status, check

    nameservers = [(entry.host, entry.port) for entry in config.dns.nameservers]
    resolver = Resolver(nameservers or None, timeout=config.dns.timeout)
    definite = temporary = False
    seen: set[tuple[str, str]] = set()
    for block in config.dkim:
        which = f"[[dkim]] {block.name or block.domain!r} (selector {block.selector})"
        glob = block.domain.lower()
        if domain is not None and not fnmatch.fnmatchcase(domain, glob):
            continue  # (this block does not sign that domain's mail)
        signing = block.signing_domain or domain or (None if any(c in glob for c in "*?[") else glob)
        if signing is None:
            print(f"{which}: not checked: without signing_domain it signs as each author domain; give --domain D")
            definite = True
            continue
        key = load_key(block.private_key, block.algorithm)  # (the configuration loaded it: no error now)
        name = f"{block.selector}._domainkey.{signing}".lower()
        if (name, public_value(key)) in seen:
            continue  # (another block with the same key and name: one answer)
        seen.add((name, public_value(key)))
        finding = await check(resolver, name, key)
        print(f"{name}: {finding.status.value}: {finding.detail} ({which}, {block.private_key})")
        temporary |= finding.status is Status.FAILED
        definite |= finding.status not in (Status.OK, Status.FAILED)
    if not seen and not definite:
        where = f" signs the mail of {domain}" if domain is not None else " is configured"
        print(f"pigeon: no [[dkim]] block{where}: nothing to check", file=sys.stderr)
        return 1
    # A key known to be wrong is worth saying over a lookup that may answer later.
    return 1 if definite else EX_TEMPFAIL if temporary else 0
