"""`pigeon config show`: the effective configuration, as TOML (Postfix's `postconf`).

Its own command rather than `pigeon serve --check --show`: it starts nothing and checks
nothing beyond what loading the file checks, it is read by people and scripts (`| grep`,
`diff`), and `serve`'s options are about running a node.

Every key with its value, defaults included (`postconf`, `postconf -d` merged), or with
`--changed` only the keys the file sets (`postconf -n`), each with the value it has once
loaded: a relative path is shown as the absolute one it names, a size in bytes, a duration in
seconds. A key whose default is "not set" is left out unless set. Secrets are shown as `***`:
tokens, passwords, webhook secrets, the userinfo password or token (whatever it holds) and the
secret parameters of a Redis, PostgreSQL or webhook URL (`redaction.redact_url`, as the node's
logs show them), and the value of every webhook or log hook header but a harmless one's
(`redaction.redact_headers`: Content-Type, Accept, User-Agent, ...). The output loads as the
same configuration (`pigeon serve --check -c`), once any `***` is filled in again.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Final

import msgspec

from pigeon.cli.common import add_config_option, load_config
from pigeon.config.schema import HEADERS_KEY, SECRET_KEYS, URL_KEYS, Config, toml_spelling
from pigeon.redaction import MASK, redact_headers, redact_url

EXAMPLES = """examples:
  pigeon config show -c /etc/pigeon.toml             # every key, defaults included (postconf)
  pigeon config show -c /etc/pigeon.toml --changed   # only what the file sets (postconf -n)
  pigeon config show | grep timeout                  # the built-in defaults
"""
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")


def register(commands: Any) -> None:
    config = commands.add_parser("config", help="show the effective configuration", description="The configuration.")
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show",
        help="the effective configuration as TOML, defaults included; secrets as ***",
        description="Print the effective configuration as TOML: every key, defaults included, or with --changed "
        "only those the file sets; secrets (tokens, passwords, webhook secrets, passwords in URLs) as ***. It loads "
        "again as the same configuration once the *** are filled in.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(show)
    show.add_argument("--changed", action="store_true", help="only the keys the file sets (postconf -n)")
    show.set_defaults(run=_show)


def _show(args: argparse.Namespace) -> int:
    config = load_config(args)
    effective = shown(config)
    if args.changed:
        effective = _set_in(effective, _file_data(args.config)) if args.config is not None else {}
    where = f"{args.config}" if args.config is not None else "no file: the built-in defaults"
    what = "the keys it sets" if args.changed else "every key, defaults included"
    sys.stdout.write(f"# pigeon config show ({where}): {what}; secrets shown as {MASK}\n")
    sys.stdout.write(to_toml(effective))
    return 0


def shown(config: Config) -> dict[str, Any]:
    """`config` as plain values (what TOML writes), unset keys left out, secrets redacted."""
    shown_config: dict[str, Any] = _redacted(_without_unset(msgspec.to_builtins(config, enc_hook=_plain)))
    return shown_config


def _plain(value: Any) -> Any:
    """A value of one of the config's own types as TOML has it: a Duration's seconds, a Size's
    bytes, a Path absolute (without a file, the defaults' are relative to the working directory:
    written into a file, they would be to the file's)."""
    if isinstance(value, Path):
        return str(value.absolute())
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def _without_unset(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_unset(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_unset(item) for item in value]
    return value


def _redacted(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        if key == HEADERS_KEY:  # a webhook's or log hook's: "Authorization = 'Bearer ...'", "X-Jwt = ..."
            return redact_headers(value)
        return {name: _redacted(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item, key) for item in value]
    if isinstance(value, str) and key in SECRET_KEYS:
        return MASK
    if isinstance(value, str) and key in URL_KEYS:
        # One URL: read as the clients read it, not as free text (which a space in the
        # password would end before its `@`).
        return redact_url(value)
    return value


def _file_data(path: Path) -> dict[str, Any]:
    """The file's tables and keys as written (the config loaded from it already: it parses)."""
    with path.open("rb") as file:
        return tomllib.load(file)


def _set_in(effective: Any, written: Any) -> Any:
    """Of `effective`, the keys `written` sets, and in an array of tables each block's own."""
    if isinstance(effective, dict) and isinstance(written, dict):
        return {key: _set_in(effective[key], item) for key, item in written.items() if key in effective}
    if isinstance(effective, list) and isinstance(written, list) and all(isinstance(i, dict) for i in written):
        return [_set_in(block, item) for block, item in zip(effective, written, strict=False)]
    return effective


def to_toml(config: dict[str, Any]) -> str:
    """`config` (a table of sections and arrays of tables) as a TOML document."""
    lines: list[str] = []
    for name, value in config.items():
        if isinstance(value, dict):
            _table(lines, [name], value, f"[{_key(name)}]")
        elif _is_tables(value):
            for block in value:
                _table(lines, [name], block, f"[[{_key(name)}]]")
        elif value == []:
            continue  # no [[name]] block: the default
        else:
            lines.insert(0, f"{_key(name)} = {toml_spelling(value)}")  # (before any table)
    return "\n".join(lines) + "\n"


def _table(lines: list[str], path: list[str], table: dict[str, Any], header: str) -> None:
    nested = {key: value for key, value in table.items() if _is_tables(value)}
    if header.startswith("[[") or not nested or len(nested) < len(table):
        # A section of arrays of tables alone ([[http.token]] blocks) needs no header of its
        # own: an empty "[http]" above them read as a section set to nothing. (One the file
        # writes with nothing in it keeps it: that is what it sets; a block's always starts it.)
        lines.extend(("", header) if lines else (header,))
    for key, value in table.items():
        if key not in nested:
            lines.append(f"{_key(key)} = {toml_spelling(value)}")
    for key, blocks in nested.items():  # after the table's own keys: they would be the block's
        for block in blocks:
            _table(lines, [*path, key], block, f"[[{'.'.join(_key(part) for part in (*path, key))}]]")


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else toml_spelling(name)
