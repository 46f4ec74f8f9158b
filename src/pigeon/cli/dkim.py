"""`pigeon dkim keygen`: make a DKIM key, and print its DNS record and its `[[dkim]]` block."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXAMPLES = """examples:
  pigeon dkim keygen --domain example.com --selector s2025
  pigeon dkim keygen --domain example.com --selector ed2025 --algorithm ed25519-sha256
  pigeon dkim keygen --domain example.com --selector big --bits 3072 --out /etc/pigeon/dkim/big.pem
Publish the TXT record, add the block to the configuration, then `kill -HUP` the node.
"""


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
