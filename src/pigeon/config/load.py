"""Loading the TOML file into a typed `Config`, with errors that name the file, line and key.

Relative paths in a file are taken relative to the file's directory, so a config works the
same from any working directory; without a file they are relative to the working directory.
"""

from __future__ import annotations

import difflib
import errno
import ipaddress
import os
import pwd
import re
import socket
import ssl
import tomllib
import types
import typing
import urllib.parse
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from pigeon import mime
from pigeon.config.patterns import GLOB_SETTINGS, PatternError, domain_glob
from pigeon.config.schema import (
    DKIM_HEADERS,
    DKIM_OVER_SIGNED,
    HEADERS_KEY,
    LOCAL_TOKEN_NAME,
    SECRET_KEYS,
    URL_KEYS,
    Config,
    Endpoint,
    LogTarget,
    MaildirTarget,
    PostgresqlTarget,
    ProviderConfig,
    ShapingConfig,
    SidekiqTarget,
    TargetConfig,
    WebhookTarget,
    canonical_host,
    decode_hook,
    host_problem,
    numeric_name_problem,
    toml_spelling,
)
from pigeon.config.secret_file import first_line
from pigeon.inbound.sasl import token_problem
from pigeon.inbound.search import SearchError, excludes_seen, recent_key
from pigeon.listener.passwords import PasswordFile, PasswordFileError, binding_problem
from pigeon.listener.tls import PairProblem, check_pair
from pigeon.node.privileges import IdentityError, identity
from pigeon.queue.names import queue_part_problem
from pigeon.redaction import MASK, masked
from pigeon.route_tenants import matches_everything
from pigeon.shaping.gcra import Rate
from pigeon.shaping.providers import check_name, normalise_suffix, shipped
from pigeon.shaping.reactions import ReactionError, compile_rule
from pigeon.smtp import address
from pigeon.smtp.address import canonical_literal
from pigeon.smtp.client_auth import MECHANISMS, credentials_problem
from pigeon.smtp.client_session import greeting_name_problem
from pigeon.tls import client_context

_AT: Final = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_LONGEST_IDLE: Final = 29 * 60  # seconds an IDLE may last (RFC 2177 3: re-issue at least every 29 minutes)
_ENUM_VALUE: Final = re.compile(r"Invalid enum value '(?P<value>.*)'$", re.DOTALL)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")
_TOML_LINE: Final = re.compile(r"\(at line (\d+), column \d+\)")
_MESSAGE_LINE: Final = re.compile(r", line (\d+): ")
_BLOCK: Final = re.compile(r"^\.?(?P<section>\w+(?:\.\w+)?)\[(?P<index>\d+)\](?:\.(?P<key>\w+))?(?:\[\d+\])?$")
_DOMAIN: Final = re.compile(r"(?i)[a-z0-9_]([a-z0-9_-]*[a-z0-9])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9])?)*\.?")


MIN_SPOOL_SIZE = 1024 * 1024
"""The smallest `[spool] max_size`."""


class ConfigError(Exception):
    """The configuration cannot be used. The message names the file, line and key."""


def load(path: Path | None, *, first_start: bool = False) -> Config:
    """Read and validate a config file; None gives the defaults. `first_start`: see `load_text`."""
    if path is None:
        return _finish(Config(), None, "")
    return load_text(read_text(path), path, first_start=first_start)


def read_text(path: Path) -> str:
    """The config file's text, for `load_text`; ConfigError if it cannot be read as UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the configuration file: {error.strerror}") from None
    except UnicodeDecodeError as error:
        line = path.read_bytes()[: error.start].count(b"\n") + 1
        raise ConfigError(f"{path}, line {line}: not UTF-8 text (TOML files are UTF-8)") from None


def load_text(text: str, path: Path, *, replaced_by_reload: bool = False, first_start: bool = False) -> Config:
    """Validate `text` as if it had been read from the config file `path`: relative paths are
    taken relative to its directory, and errors name it. A multi-worker node's supervisor hands
    its workers the text it read (`pigeon.node.handed`), never a copy in a file.

    `replaced_by_reload`: the text the node started with, of a worker started again after a
    reload, which takes the reloaded text's files before it serves: the files a reload takes
    (the TLS pair, the SMTP users, DKIM keys, routes' CA files) are not read from this one.
    An operator who reloaded onto new keys may have removed the old ones since.

    `first_start`: the node's own start (not a reload, a worker's restart or a command that
    reads the file), which a `[[source]] bind` this machine cannot bind stops: a typo. Later
    the address may have gone from the machine for a while; the node runs on, its mail
    waiting (`unbindable_sources` says which)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    return _load_data(data, path, text, reloadable_files=not replaced_by_reload, first_start=first_start)


def load_keys(path: Path, keys: Sequence[tuple[str, str]]) -> Config | None:
    """The defaults with only `keys` (`("log", "path")`, ...) taken from the config file at
    `path`, checked as `load` checks them (relative paths and all); None if the file is no
    TOML or one of them is wrong too. For a command that needs a few keys of a file that no
    longer loads as a whole (a key misspelt, a TLS key gone): the node runs on the last one
    that did, and an operator looking into it must still reach it."""
    try:
        text = read_text(path)
        data = tomllib.loads(text)
    except (ConfigError, tomllib.TOMLDecodeError):
        return None
    taken: dict[str, Any] = {}
    for section, key in keys:
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            taken.setdefault(section, {})[key] = table[key]
    try:
        # Only the keys: what the files a reload takes hold is no business of such a command
        # (`pigeon passwd -c` mends the very users file that would stop it).
        return _load_data(taken, path, text, reloadable_files=False)
    except ConfigError:
        return None


def _load_data(
    data: dict[str, Any],
    path: Path,
    text: str,
    providers: Sequence[str] = (),
    *,
    reloadable_files: bool = True,
    first_start: bool = False,
) -> Config:
    """`providers`: names of `[[provider]]`s left out of `data` that rules may still name;
    `reloadable_files`: read and check the files a reload takes (the TLS pair, the SMTP users,
    DKIM keys, routes' CA files), as a node's start must."""
    _accept_shorthands(data)
    if (problem := _masked_secret(data, [], None)) is not None:
        keys, block, reason = problem
        line = block_line(text, ".".join(block[0]), block[1], keys[-1]) if block else _line_of(text, keys)
        where = f"{path}, line {line}" if line else str(path)
        raise ConfigError(f"{where}: {_key_name(keys, block[1] if block else None)}: {reason}")
    try:
        config = msgspec.convert(data, Config, dec_hook=decode_hook)
    except msgspec.ValidationError as error:
        raise ConfigError(_explain(str(error), path, text, data)) from None
    return _finish(config, path, text, providers, reloadable_files=reloadable_files, first_start=first_start)


_MASKED: Final = "is the mask pigeon config show prints"


def _masked_secret(
    value: Any, keys: list[str], block: tuple[list[str], int] | None
) -> tuple[list[str], tuple[list[str], int] | None, str] | None:
    """The first secret in what the file decoded to (`value`, at `keys`) that is `***`, the mask
    `pigeon config show` prints for it (its output loaded as it is): its keys, its block (the
    array of tables' keys and its index) and what to say. Told as such, not as a token too short
    (a secret that is `***` is one nobody chose)."""
    if isinstance(value, dict):
        if keys and keys[-1] == HEADERS_KEY:
            for name, item in value.items():
                if item == MASK:
                    return keys, block, f"{name}: {toml_spelling(MASK)} {_MASKED}: put the value back"
            return None
        for key, item in value.items():
            if (found := _masked_secret(item, [*keys, key], block)) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, dict) and (found := _masked_secret(item, keys, (keys, index))) is not None:
                return found
    elif isinstance(value, str) and keys and keys[-1] in SECRET_KEYS and value == MASK:
        return keys, block, f"{toml_spelling(MASK)} {_MASKED}: put the secret back"
    elif isinstance(value, str) and keys and keys[-1] in URL_KEYS and masked(value):
        return keys, block, f"{toml_spelling(MASK)} in it {_MASKED}: put the secret back"
    return None


_ONE_OR_MORE: Final = (("smtp", "listen"), ("smtp", "relay_networks"), ("dns", "nameservers"))
"""Keys that take a list of addresses or networks, where one may be written as a string."""


def _accept_shorthands(data: dict[str, Any]) -> None:
    """Forms people write that mean one thing: `[smtp] listen = "0.0.0.0:25"` is a list of one,
    and so is `relay_networks = "10.0.0.0/8"` or `nameservers = "127.0.0.1:53"`."""
    for section, key in _ONE_OR_MORE:
        table = data.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str):
            table[key] = [table[key]]


def _finish(
    config: Config,
    path: Path | None,
    text: str,
    providers: Sequence[str] = (),
    *,
    reloadable_files: bool = True,
    first_start: bool = False,
) -> Config:
    """Checks across keys, and relative paths made relative to the file."""

    def fail(keys: list[str], reason: str, block: int | None = None) -> ConfigError:
        """`block`: which table (from 0) of an array of tables (`[[pool]]`) the key is in."""
        if path is None:
            line = None
        elif block is not None and len(keys) == 2:
            line = block_line(text, keys[0], block, keys[1])
        else:
            line = _line_of(text, keys)
        where = f"{path}, line {line}: " if line else (f"{path}: " if path is not None else "")
        return ConfigError(f"{where}{_key_name(keys, block)}: {reason}")

    smtp, spool, log = config.smtp, config.spool, config.log
    if (smtp.tls_certificate is None) != (smtp.tls_private_key is None):
        given = "tls_certificate" if smtp.tls_certificate is not None else "tls_private_key"
        raise fail(["smtp", given], "tls_certificate and tls_private_key must be given together")
    if smtp.auth_users is not None and not smtp.starttls and not smtp.allow_plaintext_auth:
        # Without TLS, AUTH would never be offered (or, offered, carry passwords in clear):
        # a users file that silently does nothing is a mistake to name, not to run with.
        reason = (
            "is set but [smtp] starttls = false: passwords would cross the network in clear. "
            "Turn starttls on, or set [smtp] allow_plaintext_auth = true to accept AUTH without TLS"
        )
        raise fail(["smtp", "auth_users"], reason)
    _check_tokens(config, fail)
    try:
        # Looked up at load, not at the start's privilege drop: a user or group the system does
        # not have is a mistake in the file (exit 2, its line), as a misspelt key is.
        identity(config.node)
    except IdentityError as error:
        raise fail(["node", error.key], error.reason) from None
    _check_names(config, text, fail)
    _check_backoffs(config, fail)
    if spool.max_size is not None and spool.max_size < MIN_SPOOL_SIZE:
        # An empty shard's database alone takes 176 KiB: under a smaller cap every message
        # would get 451 from a node that says it is up.
        raise fail(["spool", "max_size"], 'must be at least 1MiB (an empty spool takes 176 KiB); e.g. "10GiB"')
    if config.redis.url is not None and (redis_problem := _redis_url_problem(config.redis.url)) is not None:
        raise fail(["redis", "url"], redis_problem)
    if smtp.max_line_length < 78:
        raise fail(["smtp", "max_line_length"], "must be at least 78 (RFC 5322 2.1.1 recommends 78, allows 998)")
    if (needed := len(smtp.hostname.encode()) + mime.SHORT_MESSAGE_ID_FRAME) > smtp.max_line_length:
        # Injected mail gets a Message-ID naming the host, on a line the content check holds
        # to this limit as it holds the client's: with less room every such message is refused.
        reason = (
            f"is {smtp.max_line_length}: a Message-ID naming [smtp] hostname ({smtp.hostname!r}) on a line of its"
            f" own takes {needed} octets; set it to {needed} or more, or a shorter hostname"
        )
        raise fail(["smtp", "max_line_length"], reason)
    if not smtp.listen:
        raise fail(["smtp", "listen"], "name at least one address")
    if config.node.worker_timeout < 2:
        # Below that, a worker busy with one long step (a reload reading keys) would be killed.
        raise fail(["node", "worker_timeout"], 'must be at least 2 seconds (e.g. "30s")')
    if not smtp.postmaster:
        smtp.postmaster = f"postmaster@{smtp.hostname}"
    elif (problem := address.check(smtp.postmaster)) is not None:
        raise fail(["smtp", "postmaster"], f"{smtp.postmaster!r}: {problem.text}")
    if config.delivery.max_message_rate is not None:
        try:
            Rate.parse(config.delivery.max_message_rate)
        except ValueError as error:
            raise fail(["delivery", "max_message_rate"], str(error)) from None
    for index, queue in enumerate(config.queue):
        if queue.max_message_rate is not None:
            try:
                Rate.parse(queue.max_message_rate)
            except ValueError as error:
                raise fail(["queue", "max_message_rate"], f"queue {queue.name!r}: {error}", index) from None
    problems = shaping_problems(config, path, text)
    if problems:
        raise ConfigError(problems[0])
    _check_patterns(config, fail)
    _check_reactions(config, fail, providers)
    if path is not None:
        base = path.parent
        spool.path = _resolve(spool.path, base)
        log.path = _resolve(log.path, base)
        if smtp.tls_certificate is not None and smtp.tls_private_key is not None:
            smtp.tls_certificate = _resolve(smtp.tls_certificate, base)
            smtp.tls_private_key = _resolve(smtp.tls_private_key, base)
        if smtp.auth_users is not None:
            smtp.auth_users = _resolve(smtp.auth_users, base)
        config.delivery.bounce_rules = [_resolve(p, base) for p in config.delivery.bounce_rules]
        module = config.policy.module
        if module is not None and (module.endswith(".py") or "/" in module):
            config.policy.module = str(_resolve(Path(module), base))
        elif module is not None and (beside := _beside(module, base)) is not None:
            config.policy.module = str(beside)
    _check_inbound(config, fail)
    _check_log_hooks(config, fail)
    _check_egress(config, fail, first_start=first_start)
    if path is not None:
        for target in config.target:
            if isinstance(target, (MaildirTarget, LogTarget)):
                target.path = _resolve(target.path, path.parent)
            if isinstance(target, WebhookTarget) and target.ca_file is not None:
                target.ca_file = _resolve(target.ca_file, path.parent)
        for hook in config.log_hook:
            if hook.ca_file is not None:
                hook.ca_file = _resolve(hook.ca_file, path.parent)
        for mailbox in config.mailbox:
            if mailbox.password_file is not None:
                mailbox.password_file = _resolve(mailbox.password_file, path.parent)
            if mailbox.ca_file is not None:
                mailbox.ca_file = _resolve(mailbox.ca_file, path.parent)
        if config.delivery.ca_file is not None:
            config.delivery.ca_file = _resolve(config.delivery.ca_file, path.parent)
        if config.mta_sts.ca_file is not None:
            config.mta_sts.ca_file = _resolve(config.mta_sts.ca_file, path.parent)
        if config.tls_rpt.ca_file is not None:
            config.tls_rpt.ca_file = _resolve(config.tls_rpt.ca_file, path.parent)
        for route in config.route:
            if route.ca_file is not None:
                route.ca_file = _resolve(route.ca_file, path.parent)
            if route.auth_password_file is not None:
                route.auth_password_file = _resolve(route.auth_password_file, path.parent)
    _check_files(config, fail, reloadable=reloadable_files)
    _check_route_auth(config, fail, reloadable=reloadable_files)
    _check_route_tenants(config, fail)
    _check_directories(config, fail)
    _check_listen_addresses(config, text, fail)
    _check_dkim(config, path, text, fail, keys=reloadable_files)
    if reloadable_files and smtp.auth_users is not None:
        users = smtp.auth_users
        if not users.is_file():
            raise fail(["smtp", "auth_users"], f"no users file at {users} (create it: pigeon passwd -c {users} USER)")
        # Read as DKIM keys are: a line no user can log in with stops the start (exit 2, naming
        # the key) and a reload (its supervisor keeps saying so), not a worker's start after.
        try:
            PasswordFile.load(users)
        except PasswordFileError as error:
            raise fail(["smtp", "auth_users"], str(error)) from None
    module = config.policy.module
    if module is not None and (module.endswith(".py") or "/" in module) and not Path(module).is_file():
        raise fail(["policy", "module"], f"no policy module file at {module}")
    for rules in config.delivery.bounce_rules:
        if not rules.is_file():
            raise fail(["delivery", "bounce_rules"], f"no bounce rule file at {rules}")
    return config


def problems(path: Path) -> list[str]:
    """Every problem found in a config file, for `pigeon shaping check`: each `[[provider]]` and
    `[[shaping]]` block on its own, then the whole file (whose first other problem ends it)."""
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        try:
            load(path)
        except ConfigError as error:
            return [str(error)]  # what load() says of it
        raise
    first: str | None = None
    blocks = data.get("provider")
    blocks = blocks if isinstance(blocks, list) else []
    named = [block["name"] for block in blocks if isinstance(block, dict) and isinstance(block.get("name"), str)]
    try:  # the rest of the file, whose own first problem would hide behind the blocks'
        rest = {k: v for k, v in data.items() if k not in ("provider", "shaping")}
        _load_data(rest, path, text, named)  # a [[reaction]] may name the file's [[provider]]s
    except ConfigError as error:
        first = str(error)
    found: list[str] = []
    decoded: dict[str, list[tuple[int, Any]]] = {"provider": [], "shaping": []}
    reported: set[tuple[str, int, str]] = set()  # (section, index, key) already named as wrong
    for section, kind in (("provider", ProviderConfig), ("shaping", ShapingConfig)):
        blocks = data.get(section)
        for index, block in enumerate(blocks if isinstance(blocks, list) else []):
            try:
                decoded[section].append((index, msgspec.convert(block, kind, dec_hook=decode_hook)))
            except msgspec.ValidationError as error:
                at = f" - at `$.{section}[{index}]"
                wrong, messages = _each_key_problem(block, kind)
                for message in messages or [str(error)]:
                    message = message.replace(" - at `$", at, 1) if " - at `$" in message else f"{message}{at}`"
                    found.append(_explain(message, path, text, data))
                # The keys that are right on their own still get the checks across keys (an
                # unknown provider, a bad rate or suffix): one misspelt key hides nothing else.
                reported |= {(section, index, key) for key in wrong}
                partial = _partial_block(block, kind, wrong)
                if partial is not None:
                    decoded[section].append((index, partial))
    delivery = data.get("delivery")
    defaults = delivery.get("provider_defaults", True) if isinstance(delivery, dict) else True
    found += _block_problems(decoded["provider"], decoded["shaping"], defaults is not False, path, text, reported)
    if not found and first is None:
        # The blocks and the rest are each right: what is left are checks across them, such
        # as a [[shaping]] block's source, which needs the file's [[source]]s.
        try:
            _load_data(data, path, text)
        except ConfigError as error:
            return [str(error)]
    return sorted([*found, first] if first else found, key=_line_number)


def _each_key_problem(block: Any, kind: type[msgspec.Struct]) -> tuple[set[str], list[str]]:
    """What is wrong with each key of a block that did not decode, key by key (msgspec stops
    at the first): a block with a misspelt key and a bad value gets both named. A required key
    that is missing is named once. Returns the wrong or missing keys and the messages (none if
    no key is wrong on its own)."""
    if not isinstance(block, dict):
        return set(), []
    wrong: set[str] = set()
    found = []
    for key, value in block.items():
        try:
            msgspec.convert({key: value}, kind, dec_hook=decode_hook)
        except msgspec.ValidationError as error:
            if not str(error).startswith("Object missing required field"):
                wrong.add(key)
                found.append(str(error))
    for field in msgspec.structs.fields(kind):
        if field.required and field.encode_name not in block:
            wrong.add(field.encode_name)
            found.append(f"missing (every such block needs one) - at `$.{field.encode_name}`")
    return wrong, found


def _partial_block(block: Any, kind: type[msgspec.Struct], wrong: set[str]) -> Any:
    """A block that did not decode, made of its keys that are right on their own, for the
    checks across keys; a required key it lacks (already named) stands in empty. None when
    not even that decodes."""
    if not isinstance(block, dict):
        return None
    right = {key: value for key, value in block.items() if key not in wrong}
    for field in msgspec.structs.fields(kind):
        if field.required and field.encode_name not in right:
            right[field.encode_name] = [] if typing.get_origin(field.type) is list else ""
    try:
        return msgspec.convert(right, kind, dec_hook=decode_hook)
    except msgspec.ValidationError:
        return None


def _line_number(message: str) -> int:
    found = _MESSAGE_LINE.search(message)
    return int(found.group(1)) if found else 0


def shaping_problems(config: Config, path: Path | None, text: str) -> list[str]:
    """Every problem of the `[[provider]]` and `[[shaping]]` blocks (not only the first, for
    `pigeon shaping check`), each naming the block, its key and its line."""
    providers, shapings = list(enumerate(config.provider)), list(enumerate(config.shaping))
    return _block_problems(providers, shapings, config.delivery.provider_defaults, path, text)


def _block_problems(
    providers: list[tuple[int, ProviderConfig]],
    shapings: list[tuple[int, ShapingConfig]],
    provider_defaults: bool,
    path: Path | None,
    text: str,
    reported: Collection[tuple[str, int, str]] = (),
) -> list[str]:
    """The checks across keys of the blocks that decoded (each with its index in the file), or
    of what decoded of a block: a key in `reported` was named as wrong already."""
    problems: list[str] = []

    def problem(section: str, index: int, key: str, reason: str) -> None:
        if (section, index, key) in reported:
            return
        line = block_line(text, section, index, key) if path is not None else None
        where = f"{path}, line {line}: " if line else (f"{path}: " if path is not None else "")
        problems.append(f"{where}[[{section}]] #{index + 1} {key}: {reason}")

    names: list[str] = []
    for index, block in providers:
        try:
            check_name(block.name)
        except ValueError as error:
            problem("provider", index, "name", str(error))
        if block.name in names:
            problem("provider", index, "name", f"two [[provider]]s are called {block.name!r}")
        if ("provider", index, "name") not in reported:
            names.append(block.name)
        if not block.mx_suffixes:
            problem("provider", index, "mx_suffixes", 'name at least one, like ["google.com", "googlemail.com"]')
        for suffix in block.mx_suffixes:
            try:
                normalise_suffix(suffix)
            except ValueError as error:
                problem("provider", index, "mx_suffixes", str(error))
    ours = [provider.name for provider in shipped()]
    known = names + [name for name in ours if name not in names] if provider_defaults else names
    for index, shaping in shapings:
        if shaping.domain is not None:
            try:
                domain_glob(shaping.domain)
            except PatternError as error:
                problem("shaping", index, "domain", f"{shaping.domain!r} {error}")
        if shaping.domain is not None and shaping.provider is not None:
            problem("shaping", index, "provider", "give domain or provider, not both (a block is for one or the other)")
        elif shaping.domain is None and shaping.provider is None:
            if ("shaping", index, "provider") in reported:
                continue  # named as wrong: it was meant to be there
            problem("shaping", index, "domain", 'missing: give domain = "<glob>" or provider = "<name>"')
        elif shaping.provider is not None and shaping.provider not in known:
            reason = f"no provider called {shaping.provider!r}"
            close = difflib.get_close_matches(shaping.provider, known, n=1)
            if close:
                reason += f" (did you mean {close[0]!r}?)"
            elif shaping.provider in ours:
                reason += " (the shipped ones are off: [delivery] provider_defaults = false)"
            reason += f"; known: {', '.join(known) or 'none'}"
            problem("shaping", index, "provider", reason)
        if shaping.max_message_rate is not None:
            try:
                Rate.parse(shaping.max_message_rate)
            except ValueError as error:
                problem("shaping", index, "max_message_rate", str(error))
    return problems


def key_line(text: str, keys: list[str]) -> int | None:
    """The line where a `[section] key` is set in a file, or None if it is not set there."""
    line = _line_of(text, keys)
    if line is None:
        return None
    written = text.splitlines()[line - 1]
    return line if "=" in written and _dotted(written.split("=", 1)[0])[-1] == keys[-1] else None


def block_line(text: str, section: str, index: int, key: str | None = None) -> int | None:
    """The line of the `index`-th (from 0) `[[section]]` table of a file, or of `key` in it
    when it is set there: best effort, for messages only."""
    count = -1
    inside = False
    header_line: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("["):
            if inside:
                break  # the next table: the key is not in this one
            if line.split("#", 1)[0].replace(" ", "") == f"[[{section}]]":
                count += 1
                if count == index:
                    inside, header_line = True, number
                    if key is None:
                        return number
            continue
        if inside and "=" in line and _dotted(line.split("=", 1)[0])[0] == key:
            return number
    return header_line


def _check_patterns(config: Config, fail: Callable[..., ConfigError]) -> None:
    """Every glob setting checked, and normalised as the names it is matched against are
    (lower case, no final dot): see `config.patterns`."""
    for section, key, kind in GLOB_SETTINGS:
        for index, block in enumerate(getattr(config, section)):
            value = getattr(block, key)
            if value is None:
                continue
            try:
                setattr(block, key, kind(value))
            except PatternError as error:
                raise fail([section, key], f"{value!r} {error}", index) from None


def _check_reactions(config: Config, fail: Callable[..., ConfigError], others: Sequence[str] = ()) -> None:
    ids = [rule.id for rule in config.reaction]
    providers = [provider.name for provider in config.provider] + list(others)
    if config.delivery.provider_defaults:
        providers += [provider.name for provider in shipped() if provider.name not in providers]
    for index, rule in enumerate(config.reaction):
        if ids.count(rule.id) > 1:
            again = ids.index(rule.id, index + 1)
            raise fail(["reaction", "id"], f"two [[reaction]]s are called {rule.id!r}", again)
        if not rule.enabled:
            continue  # off: `id` and `enabled = false` are all it needs
        try:
            compile_rule(rule)
        except ReactionError as error:
            raise fail(["reaction", error.key], f"{rule.id}: {error}", index) from None
        # A rule for a provider nobody knows would match no site, silently, for ever.
        named = (rule.provider,) if isinstance(rule.provider, str) else tuple(rule.provider or ())
        for name in named:
            if name not in providers:
                reason = f"{rule.id}: no provider called {name!r}"
                close = difflib.get_close_matches(name, providers, n=1)
                reason += f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(["reaction", "provider"], f"{reason}; known: {', '.join(providers) or 'none'}", index)


def _beside(module: str, base: Path) -> Path | None:
    """The file a module name names beside the config file, if there is one: it wins over a
    module of that name on sys.path (`module = "mailbox"` beside a mailbox.py means that file,
    not the standard library's mailbox, which defines no hooks). Not a dotted name: a package's
    module, loaded as a lone file, could not import its package (`from . import helpers`,
    `from acme import util`); it is imported as one, the config's directory first on sys.path
    (`policy.hooks._import`)."""
    if "." in module or not module.isidentifier():
        return None
    candidate = base / f"{module}.py"
    return candidate if candidate.is_file() else None


def _check_inbound(config: Config, fail: Callable[..., ConfigError]) -> None:
    names = [target.name for target in config.target]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise fail(["target", "name"], f"two [[target]]s are called {name!r}", index)
    known = ", ".join(repr(n) for n in names) or "none is configured"
    for index, target in enumerate(config.target):
        if isinstance(target, PostgresqlTarget) and not target.dsn.startswith(("postgresql://", "postgres://")):
            # asyncpg takes URLs only: a libpq key=value DSN would load, then fail at every handoff.
            url = "postgresql://user@host:5432/database, with :password after the user name"
            scheme, colon_slashes, _ = target.dsn.partition("://")
            given = f"{scheme}:// is not PostgreSQL's" if colon_slashes else "not key=value"
            raise fail(["target", "dsn"], f"target {target.name!r}: give the DSN as a URL ({url}), {given}", index)
        if isinstance(target, PostgresqlTarget) and (problem := _dsn_port_problem(target.dsn)) is not None:
            raise fail(["target", "dsn"], f"target {target.name!r}: {problem}", index)
        redis_url = target.redis_url if isinstance(target, SidekiqTarget) else None
        if redis_url is not None and (problem := _redis_url_problem(redis_url)) is not None:
            raise fail(["target", "redis_url"], f"target {target.name!r}: {problem}", index)
        if isinstance(target, WebhookTarget) and (problem := _webhook_url_problem(target.url)) is not None:
            # Loaded, it would fail every handoff "for now", and be retried until max_age.
            raise fail(["target", "url"], f"target {target.name!r}: {problem}", index)
        # Sent with every handoff: one aiohttp refuses would fail them all, "for now", until max_age.
        headers = target.headers if isinstance(target, WebhookTarget) else {}
        if (problem := _header_problem(headers)) is not None:
            raise fail(["target", "headers"], f"target {target.name!r}: {problem}", index)
    for index, mailbox in enumerate(config.mailbox):
        if mailbox.target not in names:
            raise fail(["mailbox", "target"], f"no [[target]] called {mailbox.target!r} (known: {known})", index)
        if (problem := host_problem(mailbox.host)) is not None:
            raise fail(["mailbox", "host"], f"mailbox {mailbox.name!r}: {problem}", index)
        if not mailbox.username or any(char.isspace() or not char.isprintable() for char in mailbox.username):
            # LOGIN sends it as an atom: white space would split it, a line break add a command.
            reason = (
                f"mailbox {mailbox.name!r}: {mailbox.username!r} is empty or holds white space or a control character"
            )
            raise fail(["mailbox", "username"], reason, index)
        if mailbox.password is not None and any(char in mailbox.password for char in "\r\n\x00"):
            reason = f"mailbox {mailbox.name!r}: the password holds a line break or NUL, which IMAP cannot send"
            raise fail(["mailbox", "password"], reason, index)
        if mailbox.password is None and mailbox.password_file is None:
            raise fail(["mailbox", "username"], f"mailbox {mailbox.name!r} needs password or password_file", index)
        if mailbox.auth == "xoauth2" and mailbox.password is not None and (bad := token_problem(mailbox.password)):
            # Sent, an empty token is refused as any wrong one; one not ASCII cannot be sent.
            reason = f'mailbox {mailbox.name!r}: auth = "xoauth2" takes an OAuth2 access token as password, and {bad}'
            raise fail(["mailbox", "password"], reason, index)
        if mailbox.password is not None and mailbox.password_file is not None:
            # One would be used and the other ignored: which one the operator meant, nobody knows.
            reason = f"mailbox {mailbox.name!r}: give password or password_file, not both"
            raise fail(["mailbox", "password_file"], reason, index)
        if mailbox.after_delivery == "move" and not mailbox.move_to:
            raise fail(
                ["mailbox", "after_delivery"], f'mailbox {mailbox.name!r}: "move" needs move_to = "<folder>"', index
            )
        if mailbox.after_delivery != "move" and mailbox.move_to:
            # The mail would not go where move_to says: deleted, or left in the folder, instead.
            done = "deleted" if mailbox.after_delivery == "delete" else "flagged \\Seen and left in the folder"
            reason = (
                f'mailbox {mailbox.name!r}: move_to is for after_delivery = "move", and after_delivery is '
                f'"{mailbox.after_delivery}" (messages handed over are {done}): remove move_to, or set '
                'after_delivery = "move"'
            )
            raise fail(["mailbox", "move_to"], reason, index)
        for key in ("move_to", "failed_folder"):
            if getattr(mailbox, key) == mailbox.folder:
                # Moved into the folder it came from, it would come back as new mail, forever.
                raise fail(
                    ["mailbox", key], f"mailbox {mailbox.name!r}: must differ from folder ({mailbox.folder!r})", index
                )
        if (recent := recent_key(mailbox.search)) is not None:
            # \Recent goes to one session only: mail left waiting would never match again.
            reason = (
                f"mailbox {mailbox.name!r}: {mailbox.search!r} depends on \\Recent ({recent}), which the server gives "
                "a message in one session only and drops when it ends: a message still waiting then (refused for "
                "now, at a stop or a reconnect) would never match NEW or RECENT again; use UNSEEN instead (NEW is "
                "RECENT UNSEEN)"
            )
            raise fail(["mailbox", "search"], reason, index)
        if mailbox.after_delivery == "seen":
            # Acknowledged by \Seen, a message would still match and be looked at again, forever.
            # Decided by the search's meaning: NOT SEEN will do, OR UNSEEN FLAGGED will not.
            must = f'mailbox {mailbox.name!r}: with after_delivery = "seen" the search must exclude seen mail'
            try:
                if not excludes_seen(mailbox.search):
                    reason = f"{must}, and {mailbox.search!r} can match it: add UNSEEN (or NOT SEEN) outside any OR"
                    raise fail(["mailbox", "search"], f'{reason}, or use "move" or "delete"', index)
            except SearchError as error:
                reason = f"{must}, and Pigeon cannot read {mailbox.search!r}: {error}"
                raise fail(
                    ["mailbox", "search"], f'{reason}; fix the search, or use "move" or "delete"', index
                ) from None
        for key in ("lease", "timeout", "poll_interval", "down_after"):
            if getattr(mailbox, key) < 1:
                raise fail(["mailbox", key], f"mailbox {mailbox.name!r}: must be at least 1 second", index)
        if mailbox.idle and mailbox.poll_interval > _LONGEST_IDLE:
            # An IDLE lasts poll_interval; servers may log a client off after 30 minutes of it.
            reason = (
                f"mailbox {mailbox.name!r}: with idle = true, poll_interval is also how long an IDLE lasts before "
                "it is started again, and RFC 2177 asks for that at least every 29 minutes (a server may log an "
                'idle client off after 30): set at most "29m", or idle = false to poll this seldom'
            )
            raise fail(["mailbox", "poll_interval"], reason, index)
    watched = [(m.username, m.host.lower(), m.port, m.folder) for m in config.mailbox]
    for index, where in enumerate(watched):
        if (first := watched.index(where)) < index:
            # They would share claims: each message would reach only one of their targets.
            mailbox, other = config.mailbox[index], config.mailbox[first]
            reason = (
                f"mailbox {mailbox.name!r} watches the folder {mailbox.folder!r} of {mailbox.username}@{mailbox.host} "
                f"that mailbox {other.name!r} watches already"
            )
            raise fail(["mailbox", "name"], reason, index)
    mailbox_names = [m.name for m in config.mailbox]
    for index, name in enumerate(mailbox_names):
        if name in mailbox_names[:index]:
            raise fail(["mailbox", "name"], f"two [[mailbox]]es are called {name!r}", index)
    for index, route in enumerate(config.inbound):
        if route.target not in names:
            raise fail(["inbound", "target"], f"no [[target]] called {route.target!r} (known: {known})", index)
        if (route.recipient is None) == (route.domain is None):
            # Named by the key it has (or the route's first line), not by its target.
            key = "recipient" if route.recipient is not None else "domain" if route.domain is not None else "target"
            reason = "give each [[inbound]] route exactly one of recipient or domain"
            raise fail(["inbound", key], reason, index)


def _check_log_hooks(config: Config, fail: Callable[..., ConfigError]) -> None:
    """Each `[[log_hook]]` named once, with a URL it can POST to, headers aiohttp sends and
    record types the log has: loaded wrong, it would fail every batch, for ever (a hook never
    skips one), or send nothing."""
    from pigeon.logs.records import record_types  # (not at import: the config alone is read by `pigeon check`)

    known = record_types()
    names = [hook.name for hook in config.log_hook]
    for index, hook in enumerate(config.log_hook):
        if hook.name in names[:index]:
            raise fail(["log_hook", "name"], f"two [[log_hook]]s are called {hook.name!r}", index)
        if (problem := _webhook_url_problem(hook.url)) is not None:
            raise fail(["log_hook", "url"], f"log hook {hook.name!r}: {problem}", index)
        if (problem := _header_problem(hook.headers)) is not None:
            raise fail(["log_hook", "headers"], f"log hook {hook.name!r}: {problem}", index)
        if not hook.types:
            raise fail(["log_hook", "types"], f'log hook {hook.name!r}: name at least one record type, or ["*"]', index)
        for kind in hook.types:
            if kind != "*" and kind not in known:
                close = difflib.get_close_matches(kind, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
                raise fail(["log_hook", "types"], f"log hook {hook.name!r}: no record type {kind!r}{hint}", index)
        if hook.max_retry_interval < hook.retry_interval:
            reason = f"log hook {hook.name!r}: must be at least its retry_interval ({hook.retry_interval:g}s)"
            raise fail(["log_hook", "max_retry_interval"], reason, index)


def _redis_url_problem(url: str) -> str | None:
    """What is wrong with a Redis URL (None: nothing), as the client would find it at the first
    command, after the node said it was up: redis://, rediss:// or unix://, a port from 1 to
    65535, a database number. (The URL is never shown: it may hold a password.)"""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"not a Redis URL: {_url_syntax_problem(error)} (e.g. redis://127.0.0.1:6379/0)"
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        shown = f"scheme {parts.scheme}:// is not" if parts.netloc else "no scheme: it must start with"
        return f"{shown} redis://, rediss:// or unix:// (e.g. redis://127.0.0.1:6379/0)"
    if scheme == "unix":
        return None if parts.path else "unix:// needs the socket's path (unix:///run/redis/redis.sock)"
    if not parts.hostname:
        return "no host (e.g. redis://127.0.0.1:6379/0)"
    if port == 0:
        return "port 0 is no server's; a port to connect to is 1 to 65535"
    database = parts.path.strip("/")
    if database and not database.isdigit():
        return f"the path must be a database number (redis://host:6379/0), not /{database}"
    return None


def _dsn_port_problem(dsn: str) -> str | None:
    """What is wrong with a PostgreSQL URL's port (None: nothing, or none given: 5432): a port
    to connect to is 1 to 65535, and 0, a listener's "any free port", is no server's. (The URL
    is not shown: it may hold a password.)"""
    try:
        port = urllib.parse.urlsplit(dsn).port
    except ValueError as error:
        example = "e.g. postgresql://host:5432/database, user:password@ before the host"
        return f"not a URL: {_url_syntax_problem(error)} ({example})"
    return "port 0 is no server's; a port to connect to is 1 to 65535" if port == 0 else None


def _header_problem(headers: dict[str, str]) -> str | None:
    """What makes one of `headers` (sent with every request) unsendable, or None."""
    for name, value in headers.items():
        if not _HTTP_TOKEN.fullmatch(name):
            return f"{name!r} is not an HTTP header field name (RFC 9110 5.6.2)"
        if any((char < " " and char != "\t") or char == "\x7f" for char in value):
            # The value is not shown: it is often a secret (Authorization).
            return f"the value of {name!r} holds a line break or control character"
    return None


def _webhook_url_problem(url: str) -> str | None:
    """What is wrong with a webhook `url` (None: nothing): it must be http:// or https:// with a
    host, and a port, if any, from 1 to 65535. (The URL is not shown: it may hold a password or
    token, which a mistyped URL is no safer to mask.)"""
    try:
        parts = urllib.parse.urlsplit(url)
        why = "port 0 is no server's (a port to connect to is 1 to 65535)" if parts.port == 0 else ""
    except ValueError as error:
        why = f"not a URL: {_url_syntax_problem(error)}"
    else:
        if parts.scheme.lower() not in ("http", "https") and parts.netloc:
            why = f"scheme {parts.scheme!r} is not http or https"
        elif parts.scheme.lower() not in ("http", "https"):
            why = "no http:// or https:// at the start"
        elif not parts.hostname:
            why = "no host"
    if not why:
        return None
    return f'{why}; expected an http:// or https:// URL with a host, like "https://app.example/inbound"'


def _url_syntax_problem(error: ValueError) -> str:
    """What `urllib` found wrong with a URL, in words that quote none of it. A URL may hold a
    password, and one holding `/`, `?` or `#` ends the host early: what `urllib` then calls the
    port ("could not be cast to integer value as 'SEC'") is the password's beginning."""
    said = str(error)
    if said.startswith("Port could not be cast"):
        return (
            "what follows the host's ':' is no port number (a password that holds '/', '?' or '#' "
            "must have them percent-encoded: %2F, %3F, %23)"
        )
    if said.startswith("Port out of range"):
        return "the port is out of range (a port to connect to is 1 to 65535)"
    if "IPv6" in said or "IPv4" in said:
        return "the host in [brackets] is no IPv6 address"
    return "it cannot be read as a URL (percent-encode what its password or path holds of '/?#@ %')"


_SOURCE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _check_egress(config: Config, fail: Callable[..., ConfigError], *, first_start: bool = False) -> None:
    """`[[source]]`s with usable local addresses (bound, at the node's `first_start`),
    `[[pool]]`s of known sources with positive weights, and every pool or source named
    elsewhere defined."""
    implicit = config.delivery.source
    if not _SOURCE_NAME.fullmatch(implicit):
        reason = "letters, digits, '.', '_' and '-' only (it is part of ready queue names, <source>-><site>)"
        raise fail(["delivery", "source"], f"{implicit!r}: {reason}")
    sources = [source.name for source in config.source]
    for index, source in enumerate(config.source):
        which = f"source {source.name!r}"
        if not _SOURCE_NAME.fullmatch(source.name):
            reason = "letters, digits, '.', '_' and '-' only (it is part of ready queue names, <source>-><site>)"
            raise fail(["source", "name"], f"{which}: {reason}", index)
        if sources.count(source.name) > 1:
            again = sources.index(source.name, index + 1)
            raise fail(["source", "name"], f"two [[source]]s are called {source.name!r}", again)
        if source.name == implicit:
            reason = f"{which} is the name of the implicit source ([delivery] source = {implicit!r}): choose another"
            raise fail(["source", "name"], reason, index)
        try:
            address = ipaddress.ip_address(source.bind)
        except ValueError:
            raise fail(["source", "bind"], f"{which}: {source.bind!r} is not an IP address", index) from None
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        if mapped is not None and not mapped.is_unspecified:
            # An IPv6 socket bound to it: delivery would try the MX's IPv6 addresses only,
            # which an IPv4 address cannot reach, and the mail would wait until max_age.
            reason = (
                f"{which}: {source.bind} is an IPv4-mapped IPv6 address, from which no MX can be reached: "
                f'give its IPv4 form, bind = "{mapped}"'
            )
            raise fail(["source", "bind"], reason, index)
        if address.is_unspecified or (mapped is not None and mapped.is_unspecified):
            # The OS would pick the address, as for the implicit source, under this source's
            # EHLO name and limits: a name that need not match the address's PTR.
            reason = (
                f"{which}: {source.bind} is the unspecified address (any address of the machine): "
                "give the one address its mail leaves from"
            )
            raise fail(["source", "bind"], reason, index)
        # Only at the node's first start: later (a reload, a worker started again) an address
        # gone from the machine for a while must not stop the rest of the node's mail.
        if first_start and (problem := _unbindable(address)) is not None:
            raise fail(["source", "bind"], f"{which}: cannot bind to {source.bind}: {problem}", index)
        if source.ehlo and (problem := _greeting_name_problem(source.ehlo)) is not None:
            raise fail(["source", "ehlo"], f"{which}: {source.ehlo!r} {problem}", index)
    known = ", ".join(repr(n) for n in sources) or "none is configured"
    pools = [pool.name for pool in config.pool]
    for index, pool in enumerate(config.pool):
        which = f"pool {pool.name!r}"
        if pools.count(pool.name) > 1:
            raise fail(["pool", "name"], f"two [[pool]]s are called {pool.name!r}", pools.index(pool.name, index + 1))
        if not pool.sources:
            raise fail(["pool", "sources"], f"{which}: name at least one [[source]]", index)
        members: list[str] = []
        for member in pool.sources:
            name, weight = (member, 1) if isinstance(member, str) else (member.source, member.weight)
            if name not in sources:
                raise fail(["pool", "sources"], f"{which}: no [[source]] called {name!r} (known: {known})", index)
            if name in members:
                raise fail(["pool", "sources"], f"{which}: source {name!r} is listed twice", index)
            if weight < 1:
                reason = f"{which}: source {name!r} has weight {weight}; weights are whole numbers from 1"
                raise fail(["pool", "sources"], reason, index)
            members.append(name)
    known_pools = ", ".join(repr(n) for n in pools) or "none is configured"
    if config.delivery.pool is not None and config.delivery.pool not in pools:
        raise fail(["delivery", "pool"], f"no [[pool]] called {config.delivery.pool!r} (known: {known_pools})")
    for index, queue in enumerate(config.queue):
        if queue.pool is not None and queue.pool not in pools:
            reason = f"queue {queue.name!r}: no [[pool]] called {queue.pool!r} (known: {known_pools})"
            raise fail(["queue", "pool"], reason, index)
    for index, shaping in enumerate(config.shaping):
        if shaping.source is not None and shaping.source not in sources:
            reason = f"no [[source]] called {shaping.source!r} (known: {known})"
            raise fail(["shaping", "source"], reason, index)


def unbindable_sources(config: Config) -> list[str]:
    """A warning for each `[[source]]` whose address this machine cannot bind now (gone since
    the node started, or not yet back): its mail waits (`451 4.4.1`) until it can."""
    found = []
    for index, source in enumerate(config.source):
        address = ipaddress.ip_address(source.bind)  # (checked at load)
        if (problem := _unbindable(address)) is not None:
            found.append(
                f"{_key_name(['source', 'bind'], index)}: source {source.name!r}: cannot bind to {source.bind}: "
                f"{problem}: mail from it waits (451 4.4.1) until the address is back; a start of the node stops on it"
            )
    return found


def unreachable_delay_warnings(config: Config) -> list[str]:
    """A warning for `[delivery]` and each `[[queue]]` whose `delay_warning` is no shorter than
    its `max_age` (as the queue inherits them): a message expires (Expiration, and its DSN)
    before it has waited that long, so the "delayed" DSN is never sent. Said, not refused: the
    file means something, only not what was meant (a unit slip, "10d" for "10m")."""
    found = []
    delivery = config.delivery
    if 0 < delivery.delay_warning >= delivery.max_age:
        found.append(
            f"[delivery] delay_warning {_span(delivery.delay_warning)} is not shorter than [delivery] max_age "
            f"{_span(delivery.max_age)}: mail expires before it has waited that long, so no delayed DSN is ever "
            "sent; make it shorter than max_age (or 0: none)"
        )
    for index, queue in enumerate(config.queue):
        warning = queue.delay_warning if queue.delay_warning is not None else delivery.delay_warning
        max_age = queue.max_age if queue.max_age is not None else delivery.max_age
        if queue.delay_warning is None and queue.max_age is None:
            continue  # [delivery]'s pair, said above
        if 0 < warning >= max_age:
            whose = "" if queue.delay_warning is not None else " ([delivery]'s)"
            age_whose = "" if queue.max_age is not None else " ([delivery]'s)"
            found.append(
                f"[[queue]] #{index + 1} (name {queue.name!r}): delay_warning {_span(warning)}{whose} is not shorter "
                f"than its max_age {_span(max_age)}{age_whose}: its mail expires before it has waited that long, so "
                "no delayed DSN is ever sent; make it shorter than max_age (or 0: none)"
            )
    return found


def _span(seconds: float) -> str:
    """A duration as the file may write it: "10d", "2h", "2m", "90s"."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f'"{int(seconds // size)}{unit}"'
    return f'"{seconds:g}s"'


def _unbindable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a socket cannot bind to `address` on this machine (None: it can). Checked at load, so
    that a typo stops the start rather than failing every connection from the source."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))
    except OSError as error:
        return f"{error.strerror or error} (not an address of this machine?)"
    return None


def _check_dkim(
    config: Config, path: Path | None, text: str, fail: Callable[..., ConfigError], *, keys: bool = True
) -> None:
    """Each [[dkim]] block: a key that can sign with its algorithm, and a header list that
    covers From and leaves out Pigeon's own headers (taken off before delivery, they would
    break the signature); and no two blocks that sign the same mail with the same key,
    domain and selector (a message carries such a signature once, the first block's: the
    second would never sign). Blocks that only overlap (`domain = "*"` and `"example.com"`)
    are not refused: each signs the mail the other does not match."""
    if not config.dkim:
        return
    # Imported here, not with the module: DKIM's keys need `cryptography`, some 20 ms that
    # every process loading a configuration without [[dkim]] would spend for nothing.
    from pigeon.dkim.keys import KeyProblem, load_key, name_problem, public_value

    internal = {config.delivery.tenant_header.lower(), config.delivery.campaign_header.lower()}
    names = [block.name for block in config.dkim if block.name is not None]
    for name in names:
        if names.count(name) > 1:
            again = [i for i, block in enumerate(config.dkim) if block.name == name][1]
            raise fail(["dkim", "name"], f"two [[dkim]] blocks are called {name!r}", again)
    signers: dict[tuple[str, str, str, str | None, str], int] = {}  # -> the index of the block that has it
    for index, block in enumerate(config.dkim):
        # (each problem names its own block's line, not the first [[dkim]]'s)
        if (problem := name_problem("selector", block.selector)) is not None:
            raise fail(["dkim", "selector"], problem, index)
        which = f"[[dkim]] {block.name or block.domain!r} (selector {block.selector})"
        over = list(DKIM_OVER_SIGNED) if block.over_sign is True else (block.over_sign or [])
        for key, listed in (("headers", block.headers), ("over_sign", over)):
            for header in listed:
                lowered = header.strip().lower()
                if lowered in internal:
                    reason = f"{which}: {header!r} is Pigeon's own header, removed before delivery: it cannot be signed"
                    raise fail(["dkim", key], reason, index)
                if (problem := _field_name_problem(header.strip())) is not None:
                    raise fail(["dkim", key], f"{which}: {header!r} is not a header field name: it {problem}", index)
        if "from" not in {h.strip().lower() for h in block.headers}:
            raise fail(["dkim", "headers"], f"{which}: must include From (RFC 6376 5.4)", index)
        if block.tenant is not None and (problem := queue_part_problem(block.tenant)) is not None:
            # As at every door: such a tenant names no queue, and no message would be signed.
            raise fail(["dkim", "tenant"], f"{which}: tenant {block.tenant[:60]!r} {problem}", index)
        if block.signing_domain is not None:
            # Given as `domain` is (`patterns.domain_glob`): a U-label is signed as its A-label,
            # the form DNS publishes the key under and d= must take (RFC 6376 3.5).
            written = block.signing_domain
            signing = address.a_label(written[:-1] if written.endswith(".") and written != "." else written)
            labels = signing.split(".")
            if not _DOMAIN.fullmatch(signing) or "" in labels or len(signing) > 253 or max(map(len, labels)) > 63:
                raise fail(["dkim", "signing_domain"], f"{which}: {written!r} is not a domain name", index)
            block.signing_domain = signing
        if path is not None:
            block.private_key = _resolve(block.private_key, path.parent)
        if not keys:
            continue  # (a worker's start-time text that a reload replaced: see `load_text`)
        try:
            private = load_key(block.private_key, block.algorithm)
        except KeyProblem as error:
            raise fail(["dkim", "private_key"], f"{which}: {error}", index) from None
        # The same signer twice: by the key itself, so a copy of the key file is found too. Its
        # name is no part of it: without a policy that names one, both blocks sign.
        signer = (
            block.domain.lower(),
            block.selector.lower(),
            (block.signing_domain or "").lower(),
            block.tenant,
            public_value(private),
        )
        first = signers.setdefault(signer, index)
        if first != index:
            where = f"line {block_line(text, 'dkim', first)}" if path is not None else f"#{first + 1}"
            reason = (
                f"{which}: signs the same mail with the same key, domain and selector as the [[dkim]] block at "
                f"{where}: a message carries that signature once, the first block's, so this one would never "
                "sign; remove one (another header list or canonicalization needs another selector)"
            )
            raise fail(["dkim", "domain"], reason, index)


def _check_tokens(config: Config, fail: Callable[..., ConfigError]) -> None:
    """Every `[[http.token]]` a secret of its own: the API knows a caller by its secret, so two
    tokens sharing one would make whose request it was (and which scopes apply) a guess."""
    holders: dict[str, int] = {}
    names: dict[str, int] = {}
    tokens = config.http.token
    for index, token in enumerate(tokens):
        if not token.name or token.name != token.name.strip() or not token.name.isprintable():
            reason = f"{token.name!r} is not a name for the holder (written into the records of what it does): "
            reason += "give one without white space at an end or control characters"
            raise fail(["http.token", "name"], reason, index)
        if token.name == LOCAL_TOKEN_NAME:
            # The `pigeon` commands' own token is called so: what they did and what this token
            # did would read the same in AdminBounce records and `suspended_by`.
            reason = (
                f"{token.name!r} is the name of the `pigeon` commands' local token ([http] local_token): choose another"
            )
            raise fail(["http.token", "name"], reason, index)
        if names.setdefault(token.name, index) != index:
            raise fail(["http.token", "name"], f"two [[http.token]]s are called {token.name!r}", index)
        if not token.scopes:
            reason = f'[[http.token]] {token.name!r}: name at least one scope: "inject", "admin" or "read"'
            raise fail(["http.token", "scopes"], reason, index)
        if not all("!" <= char <= "~" for char in token.token):
            # It travels as `Authorization: Bearer <token>`: white space would split it, a line
            # break end the header. (The secret is not shown.)
            reason = f"[[http.token]] {token.name!r}: the secret must be printable ASCII without white space"
            reason += " (`openssl rand -hex 32` makes one)"
            raise fail(["http.token", "token"], reason, index)
        if token.tenants == []:
            reason = (
                f"[[http.token]] {token.name!r}: an empty list binds the token to no tenant, so it could do nothing: "
                "name its tenants, or leave tenants out for a token of the operator's (any tenant)"
            )
            raise fail(["http.token", "tenants"], reason, index)
        if token.tenants is not None and (problem := binding_problem(token.tenants)) is not None:
            raise fail(["http.token", "tenants"], f"[[http.token]] {token.name!r}: {problem}", index)
        if token.routing_domains is not None and token.tenants is None:
            reason = (
                f"[[http.token]] {token.name!r}: routing_domains limits the routing domains of a token bound to "
                "tenants; this one has no tenants, so it may route mail as any domain: give it tenants, or leave "
                "routing_domains out"
            )
            raise fail(["http.token", "routing_domains"], reason, index)
        globs = token.routing_domains or []
        for position, glob in enumerate(globs):
            try:
                globs[position] = domain_glob(glob)  # (as a rebind's routing_domain is read)
            except PatternError as error:
                raise fail(["http.token", "routing_domains"], f"[[http.token]] {token.name!r}: {glob!r} {error}",
                           index) from None  # fmt: skip
        first = holders.setdefault(token.token, index)
        if first != index:
            reason = (
                f"[[http.token]] {token.name!r} has the same secret as {tokens[first].name!r}: "
                "each token needs a secret of its own (`openssl rand -hex 32`)"
            )
            raise fail(["http.token", "token"], reason, index)


_MESSAGE_FIELDS: Final = frozenset({*DKIM_HEADERS, "received", "return-path", "bcc", "dkim-signature"})
"""Header fields of the message itself, which a routing header (removed before delivery) may not be."""
_HTTP_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 5.6.2: a field name


_REPLY_LINE: Final = 512
"""RFC 5321 4.5.3.1.5: the longest reply line, its CRLF included."""


def _banner_problem(banner: str, hostname: str) -> str | None:
    """Why `banner` cannot follow the hostname in the 220 greeting (None: it can). A line break
    would end the greeting early and make the rest a reply the client never asked for; RFC
    5321 4.2's textstring is printable ASCII and spaces (a tab aside, refused as any control)."""
    if any(not " " <= char <= "~" for char in banner):
        return "holds a line break, a control character or a character that is not ASCII: the banner is printable ASCII"
    if banner != banner.strip(" "):
        return "starts or ends with a space (the one after the hostname is Pigeon's)"
    line = len(f"220 {hostname} {banner}\r\n")
    if line > _REPLY_LINE:
        return (
            f"makes the greeting line {line} octets long with [smtp] hostname; RFC 5321 4.5.3.1.5 allows {_REPLY_LINE}"
        )
    return None


def _dsn_from_problem(sender: str, max_line: int) -> str | None:
    """Why `sender` cannot be the From address of a DSN (None: it can): a mailbox (an addr-spec,
    RFC 5322 3.4.1) that is ASCII once its domain is an A-label, since a DSN goes in a 7-bit
    form where the next hop lacks 8BITMIME and its header section must stay ASCII for that, and
    short enough for the field's own line (an address cannot be folded, `mime.address_header`)."""
    if (problem := address.check(sender)) is not None:
        return f"is not a mailbox: {problem.text}"
    written = address.with_a_label(sender)
    if not written.isascii():
        return "has a local part that is not ASCII: a DSN's header section must be ASCII (it may go 7-bit)"
    if len(f" <{written}>") > max_line:
        return f"does not fit on a line of [smtp] max_line_length ({max_line}) octets"
    return None


def _greeting_name_problem(name: str) -> str | None:
    """Why `name` cannot be a name Pigeon gives on the wire (EHLO, its banner, Received headers)
    (None: it can). First the very check the SMTP client makes before it greets with a name, so
    that no name is loaded that every delivery would then refuse; then the shape RFC 5321 4.1.1.1
    asks of it: a domain name, or an address literal ("[192.0.2.1]", "[IPv6:2001:db8::1]")."""
    problem = greeting_name_problem(name)
    if problem is not None:
        return problem
    if name.startswith("[") and name.endswith("]"):
        literal = name[1:-1]
        ipv6 = literal[:5].lower() == "ipv6:"
        try:
            version: int = ipaddress.ip_address(literal[5:] if ipv6 else literal).version
        except ValueError:
            version = 0  # no address at all
        if version != (6 if ipv6 else 4):
            return "is not an address literal like [192.0.2.1] or [IPv6:2001:db8::1]"
        return None
    try:
        bare = ipaddress.ip_address(name)
    except ValueError:
        pass
    else:  # `EHLO 192.0.2.1` is no RFC 5321 greeting: an address is a literal, in brackets
        literal = f"[IPv6:{bare}]" if bare.version == 6 else f"[{bare}]"
        return f'is an IP address: write it as an address literal, "{literal}"'
    if (problem := numeric_name_problem(name)) is not None:
        try:
            address = ipaddress.IPv4Address(name.removesuffix("."))  # "192.0.2.1."
        except ValueError:
            return f'{problem}: write an address as an address literal, like "[192.0.2.1]"'
        return f'is an IP address: write it as an address literal, "[{address}]"'
    if len(name) > 255:
        return "is longer than a domain name may be (255 characters, RFC 5321 4.5.3.1.2)"
    if not _DOMAIN.fullmatch(name):
        return "is not a domain name (dot-separated labels of letters, digits, '-' and '_') nor an address literal"
    return None


def _field_name_problem(name: str) -> str | None:
    """Why `name` cannot be a message header field's name (None: it can): RFC 5322 3.6.8 allows
    printable ASCII but ':' and space, at least one character."""
    if not name:
        return "is empty"
    if not all("!" <= char <= "~" and char != ":" for char in name):
        return "holds a character a header field name cannot (white space, ':', a control character, non-ASCII)"
    return None


def _check_names(config: Config, text: str, fail: Callable[..., ConfigError]) -> None:
    """The names Pigeon puts on the wire itself: refused at load, since a bad one would start a
    node whose every delivery fails (`[delivery] helo_name`), or whose banner breaks every
    connection (a line break in `[smtp] hostname`)."""
    smtp, delivery = config.smtp, config.delivery
    name = config.node.name
    if not name or any(char.isspace() or not char.isprintable() for char in name):
        # It is in every log record, seeds the message ids and names the node to the cluster:
        # a space would make records and presence entries ambiguous, a control character garble them.
        written = key_line(text, ["node", "name"]) is not None
        default = "" if written else " (the machine's host name, the default: set [node] name)"
        reason = f"{name!r}{default}: a node's name is not empty, without white space or control characters"
        raise fail(["node", "name"], f"{reason}; it is written into every log record and seeds message ids")
    if (problem := _greeting_name_problem(smtp.hostname)) is not None:
        written = key_line(text, ["smtp", "hostname"]) is not None
        default = "" if written else " (the machine's host name, the default: set [smtp] hostname)"
        reason = (
            f"{smtp.hostname!r}{default} {problem}; it is the name in the banner, EHLO replies and Received headers"
        )
        raise fail(["smtp", "hostname"], reason)
    if delivery.helo_name and (problem := _greeting_name_problem(delivery.helo_name)) is not None:
        raise fail(["delivery", "helo_name"], f"{delivery.helo_name!r} {problem}; it is the name Pigeon gives in EHLO")
    if (problem := _banner_problem(smtp.banner, smtp.hostname)) is not None:
        raise fail(["smtp", "banner"], f"{smtp.banner!r} {problem}")
    if delivery.dsn_from and (problem := _dsn_from_problem(delivery.dsn_from, smtp.max_line_length)) is not None:
        raise fail(
            ["delivery", "dsn_from"], f"{delivery.dsn_from!r} {problem}; it is the From address of Pigeon's DSNs"
        )
    rpt = config.tls_rpt
    if rpt.report_sender and (problem := _dsn_from_problem(rpt.report_sender, smtp.max_line_length)) is not None:
        raise fail(["tls_rpt", "report_sender"], f"{rpt.report_sender!r} {problem}; it is the From of TLS reports")
    if rpt.interval < 1:
        raise fail(["tls_rpt", "interval"], f"{rpt.interval:g}s is under 1s: a report covers at least a second")
    headers = (("tenant_header", delivery.tenant_header), ("campaign_header", delivery.campaign_header))
    for key, name in headers:
        if (problem := _field_name_problem(name)) is not None:
            raise fail(["delivery", key], f"{name!r} is not a header field name: it {problem}")
        if name.lower() in _MESSAGE_FIELDS:
            reason = (
                f"{name!r} is a field of the message itself: it would be removed from every message before delivery"
            )
            raise fail(["delivery", key], reason)
    if delivery.tenant_header.lower() == delivery.campaign_header.lower():
        reason = (
            f"{delivery.campaign_header!r} is tenant_header too: each part of a queue name needs a header of its own"
        )
        raise fail(["delivery", "campaign_header"], reason)


def _check_backoffs(config: Config, fail: Callable[..., ConfigError]) -> None:
    """Every backoff's ceiling at least its first interval: below it, the "doubling up to" would
    silently make every wait the ceiling, and the interval a setting that does nothing."""
    delivery = config.delivery

    def check(keys: list[str], first: float, ceiling: float, which: str, index: int | None = None) -> None:
        if ceiling < first:
            raise fail(keys, f"{ceiling:g}s is below {which} ({first:g}s): it must be at least that", index)

    check(["delivery", "max_retry_interval"], delivery.retry_interval, delivery.max_retry_interval, "retry_interval")
    site_first, site_ceiling = delivery.site_retry_interval, delivery.max_site_retry_interval
    check(["delivery", "max_site_retry_interval"], site_first, site_ceiling, "site_retry_interval")
    for index, target in enumerate(config.target):
        which = f"the retry_interval of target {target.name!r}"
        check(["target", "max_retry_interval"], target.retry_interval, target.max_retry_interval, which, index)
    for index, queue in enumerate(config.queue):
        # What the queue's mail gets: its own settings, else [delivery]'s (`node.outbound`).
        first = delivery.retry_interval if queue.retry_interval is None else queue.retry_interval
        if queue.max_retry_interval is not None:
            own = "" if queue.retry_interval is not None else " (from [delivery])"
            which = f"the retry_interval of queue {queue.name!r}{own}"
            check(["queue", "max_retry_interval"], first, queue.max_retry_interval, which, index)
        elif first > delivery.max_retry_interval:
            reason = (
                f"queue {queue.name!r}: {first:g}s is over [delivery] max_retry_interval "
                f"({delivery.max_retry_interval:g}s), which caps it: give the queue a max_retry_interval of its own"
            )
            raise fail(["queue", "retry_interval"], reason, index)


_WILDCARDS: Final = frozenset({"0.0.0.0", "::"})


def _one_spelling(host: str) -> str:
    """An IP address as one text whatever its spelling ("0:0::1" is "::1", "127.000.0.1" is
    "127.0.0.1", as address literals are compared: `canonical_literal`); a name as it is."""
    literal = canonical_literal(f"[IPv6:{host}]" if ":" in host else f"[{host}]")
    return literal[1:-1].removeprefix("IPv6:") if literal is not None else host


def _check_listen_addresses(config: Config, text: str, fail: Callable[..., ConfigError]) -> None:
    """No address listened on twice in the config itself (`[smtp] listen` and `[http] listen`
    alike; a wildcard covers every address of its port): the start would fail with "the port
    is in use (by another node, or another program)", blaming someone else."""
    seen: list[tuple[str, Endpoint, str]] = []
    for key, endpoint in [*(("[smtp] listen", e) for e in config.smtp.listen), ("[http] listen", config.http.listen)]:
        host, port = _one_spelling(endpoint.host), endpoint.port
        for other_key, other, other_host in seen:
            # (IPv6 sockets are bound IPV6_V6ONLY: "[::]:25" leaves "0.0.0.0:25" free, and the reverse)
            wildcard = host in _WILDCARDS or other_host in _WILDCARDS
            same = host == other_host or (wildcard and (":" in host) == (":" in other_host))
            if port != 0 and port == other.port and same:
                if host == other_host:
                    spelt = "" if endpoint == other else f" (as {other})"
                    reason = f"{endpoint} is {'listed twice' if key == other_key else f'also {other_key}'}{spelt}"
                else:  # a wildcard and an address on its port
                    of = "" if key == other_key else f" ({other_key})"
                    reason = f"{endpoint} and {other}{of} share a port, which a wildcard takes on every address"
                section, name = key[1:].split("] ")
                raise fail([section, name], f"{reason}: each address is listened on once")
        seen.append((key, endpoint, host))


def directories(config: Config) -> list[tuple[list[str], Path]]:
    """The directories a node makes as it starts, each with its key: `[spool] path`, `[log] path`."""
    return [(["spool", "path"], config.spool.path), (["log", "path"], config.log.path)]


def key_error(path: Path | None, text: str | None, keys: list[str], reason: str) -> ConfigError:
    """An error about the key at `keys` found after the load (the start's), worded as the load's
    are: the file `path` (`text`, its text) and the line where the key is set, if it is."""
    line = _line_of(text, keys) if path is not None and text is not None else None
    where = f"{path}, line {line}: " if line else (f"{path}: " if path is not None else "")
    return ConfigError(f"{where}{_key_name(keys)}: {reason}")


def cannot_make(directory: Path, error: OSError) -> str:
    """Why `directory` (a `[spool] path` or `[log] path`) could not be made, from the error of
    making it (or a parent of it): said of the directory the system refused to make it in."""
    failed = Path(error.filename) if isinstance(error.filename, str) else directory
    reason = error.strerror or str(error)
    if error.errno == errno.ENOENT and failed.parent.is_dir():
        # Said of a directory that is there: a file system that makes none (/proc, /sys).
        return f"{directory} cannot be made: {failed.parent} takes no new directory ({reason})"
    if failed == directory:
        return f"{directory} cannot be made: {reason}"
    return f"{directory} cannot be made: {failed}: {reason}"


def unwritable_directory(config: Config, path: Path | None, text: str | None) -> ConfigError | None:
    """For `pigeon serve --check`, which makes nothing: a `[spool] path` or `[log] path` not made
    yet whose nearest existing directory is on a read-only file system, or not writable by the
    user the check runs as (a start as that user could not make it). Every load checks that no
    file stands in their way (`_check_directories`). Not all a start may meet: a file system
    that makes no directory whatever the modes (/proc) is met by the start, which names the key
    too (`cannot_make`)."""
    for keys, directory in directories(config):
        try:
            if directory.exists():
                continue
            existing = _nearest_existing(directory.absolute())
            if existing is None or not existing.is_dir() or os.access(existing, os.W_OK | os.X_OK):
                continue  # (a file in the way: said by the load)
            read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        except OSError:
            continue  # (not ours to look into: the start says what it finds)
        if read_only:
            reason = f"{directory} cannot be made: {existing} is on a read-only file system"
        else:
            reason = f"{directory} cannot be made: {existing} is not writable by {_user()}, the user the check runs as"
        return key_error(path, text, keys, reason)
    return None


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _nearest_existing(directory: Path) -> Path | None:
    """`directory` if it is there, else the nearest of its parents that is (raises OSError)."""
    return next((path for path in (directory, *directory.parents) if path.exists()), None)


def _check_directories(config: Config, fail: Callable[..., ConfigError]) -> None:
    """The spool's and the log's directories must be directories, or be creatable: a file in
    their way would fail the start later with an errno and no key to fix."""
    for keys, directory in directories(config):
        try:
            existing = _nearest_existing(directory)
            if existing is None or existing.is_dir():
                continue
        except OSError:
            continue  # (not ours to look into: the start says what it finds)
        if existing == directory:
            raise fail(keys, f"{directory} is a file, not a directory")
        raise fail(keys, f"{directory} cannot be made: {existing} is a file, not a directory")


def _check_route_tenants(config: Config, fail: Callable[..., ConfigError]) -> None:
    """A `[[route]]`'s `tenants` (the tenants whose mail it is for, `pigeon.route_tenants`)
    name tenants, one at least, and reserve a route of some domains, not every one."""
    for index, route in enumerate(config.route):
        if route.tenants is None:
            continue
        name = f"route {route.domain!r}"
        if not route.tenants:
            reason = (
                f"{name}: tenants = [] reserves the route for no tenant, so all its mail would bounce: name the "
                "tenants whose mail it is for, or leave tenants out for a route of any tenant's mail"
            )
            raise fail(["route", "tenants"], reason, index)
        if (problem := binding_problem(route.tenants)) is not None:
            raise fail(["route", "tenants"], f"{name}: {problem}", index)
        if matches_everything(route.domain.strip()):
            reason = (
                f"{name}: a route for every domain cannot be reserved for tenants: every other tenant's mail, and "
                "Pigeon's own DSNs (of no tenant), would bounce. Give tenants to the [[route]]s of the domains "
                "whose next hop is the tenants' (a smart host that logs in with their account)"
            )
            raise fail(["route", "tenants"], reason, index)


def _check_route_auth(config: Config, fail: Callable[..., ConfigError], *, reloadable: bool = True) -> None:
    """A `[[route]]` that authenticates (`auth_username`) does so to its smart host alone, on
    TLS unless it says otherwise, with one password and mechanisms Pigeon speaks. With
    `reloadable`, its password file is read now (as each start and reload reads it), so that a
    file that is missing, empty or unusable is named at load, not at the first delivery. No
    message here shows the password."""
    # (next hop, user) -> (password, route): one password per user at a smart host. Its ready
    # queue (`Destination.security`) and its hold after a refused AUTH are per user: two
    # passwords for one user would share connections, one's refusal would hold the other's
    # mail. (Telling them apart by a hash of the password in the queue's name would put what
    # a guess can be checked against in /metrics, the API and operators' suspensions.)
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for index, route in enumerate(config.route):
        name = f"route {route.domain!r}"
        if route.tls == "implicit" and route.next_hop is None:
            reason = f'{name}: tls = "implicit" is for a smart host (next_hop, on its port 465): MX hosts take STARTTLS'
            raise fail(["route", "tls"], reason, index)
        if route.auth_username is None:
            for key in ("auth_password", "auth_password_file", "auth_mechanisms"):
                if getattr(route, key) is not None:
                    raise fail(["route", key], f"{name}: {key} is for a route with auth_username", index)
            if route.allow_plaintext_auth:
                reason = f"{name}: allow_plaintext_auth is for a route with auth_username"
                raise fail(["route", "allow_plaintext_auth"], reason, index)
            continue
        if route.next_hop is None:
            # Never to a host an MX lookup found: whoever controls the domain's DNS would get it.
            reason = (
                f"{name}: AUTH is sent only to a smart host: give next_hop (the password never goes to "
                "the MX hosts of a recipient's domain)"
            )
            raise fail(["route", "auth_username"], reason, index)
        if route.auth_password is None and route.auth_password_file is None:
            raise fail(["route", "auth_username"], f"{name} needs auth_password or auth_password_file", index)
        if route.auth_password is not None and route.auth_password_file is not None:
            reason = f"{name}: give auth_password or auth_password_file, not both"
            raise fail(["route", "auth_password_file"], reason, index)
        # What its connections use: the route's tls, else [delivery] tls.
        tls = route.tls or config.delivery.tls
        inherited = " (from [delivery] tls)" if route.tls is None else ""
        if tls == "disabled" and not route.allow_plaintext_auth:
            # As [smtp] allow_plaintext_auth says of the listener's side.
            reason = (
                f'{name}: auth_username with tls = "disabled"{inherited}: the password would cross the network in '
                'clear. Use tls = "required" (or "implicit"), or set allow_plaintext_auth = true on the route to '
                "send AUTH without TLS"
            )
            raise fail(["route", "auth_username"], reason, index)
        if route.allow_plaintext_auth and tls != "disabled":
            # An opportunistic route would send it in clear whenever STARTTLS is not to be had,
            # which whoever is on the path can arrange (STARTTLS stripping); a route that asks
            # for TLS never falls back to the clear when it authenticates.
            reason = (
                f'{name}: allow_plaintext_auth is only for tls = "disabled" (this route\'s is {tls!r}{inherited}; '
                "a route that may use TLS never sends the password without it: a STARTTLS that fails, or is "
                'stripped, would give it away). Use tls = "required" or "implicit", or tls = "disabled" to send '
                "AUTH in clear on purpose"
            )
            raise fail(["route", "allow_plaintext_auth"], reason, index)
        if route.auth_mechanisms is not None:
            mechanisms = [mechanism.upper() for mechanism in route.auth_mechanisms]
            unknown = [m for m in route.auth_mechanisms if m.upper() not in MECHANISMS]
            if unknown or not mechanisms:
                what = f"{', '.join(map(repr, unknown))} unknown" if unknown else "empty"
                reason = f"{name}: {what}: Pigeon authenticates with {', '.join(map(repr, MECHANISMS))}"
                raise fail(["route", "auth_mechanisms"], reason, index)
            route.auth_mechanisms = list(dict.fromkeys(mechanisms))
        password, key, where = route.auth_password, "auth_password", "the password"
        file = route.auth_password_file
        if file is not None:
            if not reloadable:
                password = "-"  # (read, and checked, by the start or reload that takes it)
            else:
                key, where = "auth_password_file", f"auth_password_file {file}"
                try:
                    password = first_line(file)
                except UnicodeDecodeError:
                    raise fail(["route", key], f"{name}: {where} is not UTF-8 text", index) from None
                except OSError as error:
                    raise fail(["route", key], f"{name}: {where} cannot be read: {error.strerror}", index) from None
        problem = credentials_problem(route.auth_username, password or "")
        if problem is not None:
            subject = "auth_username" if "user name" in problem else key
            where = "" if subject == "auth_username" else f" ({where})"
            raise fail(["route", subject], f"{name}: {problem}{where}", index)
        if file is not None and not reloadable:
            continue  # (not read here: compared by the start or reload that reads it)
        hop = f"{canonical_host(route.next_hop.host)}:{route.next_hop.port}"  # (one host, however spelt)
        other = seen.setdefault((hop, route.auth_username), (password or "", name))
        if other[0] != (password or ""):
            reason = (
                f"{name}: authenticates to {route.next_hop} as {route.auth_username!r} with another password than "
                f"{other[1]}: one user has one password at a smart host (give both routes the same one)"
            )
            raise fail(["route", key], reason, index)


def _check_token_file(name: str, file: Path, fail: Callable[..., ConfigError], index: int) -> None:
    """An XOAUTH2 mailbox's password_file must hold a token that can be sent (its first line,
    as each login reads it): an empty one would be sent as a token, one not ASCII cannot be.
    Whatever keeps it current may change it later; each login checks it again."""
    try:
        token = first_line(file)
    except UnicodeDecodeError:
        bad: str | None = "the token holds bytes that are not UTF-8 text"
    except OSError:
        return  # (the mailbox's login says what it cannot read)
    else:
        bad = token_problem(token)
    if bad is not None:
        reason = f'mailbox {name!r}: auth = "xoauth2": password_file {file} holds the access token, and {bad}'
        raise fail(["mailbox", "password_file"], reason, index)


def _check_files(config: Config, fail: Callable[..., ConfigError], *, reloadable: bool = True) -> None:
    """Files the config names must be there now, not at the first connection that needs them.
    `reloadable`: those a reload takes (the TLS pair, routes' CA files) too. A CA file is read
    as a certificate store, so one that holds no PEM certificate is named too."""
    named: list[tuple[list[str], Path | None, str, int | None]] = []
    if reloadable:
        named += [
            (["smtp", "tls_certificate"], config.smtp.tls_certificate, "certificate", None),
            (["smtp", "tls_private_key"], config.smtp.tls_private_key, "private key", None),
        ]
    for i, mailbox in enumerate(config.mailbox):
        named.append((["mailbox", "password_file"], mailbox.password_file, f"mailbox {mailbox.name!r}: password", i))
        named.append((["mailbox", "ca_file"], mailbox.ca_file, f"mailbox {mailbox.name!r}: CA", i))
    trust: list[tuple[list[str], Path | None, str, int | None]] = [
        (["delivery", "ca_file"], config.delivery.ca_file, "", None),  # (the key names it already)
        (["mta_sts", "ca_file"], config.mta_sts.ca_file, "", None),
        (["tls_rpt", "ca_file"], config.tls_rpt.ca_file, "", None),
    ]
    # A webhook's, like a mailbox's, is read when its target starts: a reload leaves targets
    # as they are (a restart takes a new one), so it is checked whatever `reloadable` says.
    trust += [
        (["target", "ca_file"], t.ca_file, f"target {t.name!r}", i)
        for i, t in enumerate(config.target)
        if isinstance(t, WebhookTarget)
    ]
    trust += [(["log_hook", "ca_file"], h.ca_file, f"log hook {h.name!r}", i) for i, h in enumerate(config.log_hook)]
    if reloadable:
        trust += [(["route", "ca_file"], r.ca_file, f"route {r.domain!r}", i) for i, r in enumerate(config.route)]
    blocks = list(named)
    blocks += [(keys, file, f"{what}: CA" if what else "CA", index) for keys, file, what, index in trust]
    for keys, file, what, index in blocks:
        if file is not None and not file.is_file():
            problem = "is a directory" if file.is_dir() else "does not exist"
            raise fail(keys, f"{what} file {file} {problem}", index)
    for index, mailbox in enumerate(config.mailbox):
        if mailbox.auth == "xoauth2" and mailbox.password_file is not None:
            _check_token_file(mailbox.name, mailbox.password_file, fail, index)
    certificate, key = config.smtp.tls_certificate, config.smtp.tls_private_key
    if reloadable and certificate is not None and key is not None:
        try:
            check_pair(certificate, key)
        except PairProblem as problem:
            raise fail(["smtp", "tls_certificate" if problem.which == "certificate" else "tls_private_key"],
                       str(problem)) from None  # fmt: skip
    for keys, file, what, index in trust:
        if file is None:
            continue
        try:
            client_context(verify=True, cafile=file)
        except (OSError, ssl.SSLError) as error:
            whose = f"{what}: " if what else ""
            raise fail(keys, f"{whose}CA file {file} holds no PEM certificate to trust ({error})", index) from None


def _resolve(path: Path, base: Path) -> Path:
    return path if path.is_absolute() else base / path


_ROUTE_AUTH: Final = "is here auth_username with auth_password_file (or auth_password) in the smart host's [[route]]"
_NO_RECIPIENT_REWRITING: Final = (
    "has no counterpart here: no hook changes a recipient; a [[route]] (or a policy's Changes(route=...))"
    " changes where its mail goes"
)
POSTFIX_PARAMETERS: Final = {
    "relayhost": 'is here a [[route]] with domain = "*" and next_hop = "host:port"',
    "smtp_sasl_auth_enable": _ROUTE_AUTH,
    "smtp_sasl_password_maps": _ROUTE_AUTH,
    "smtp_tls_security_level": 'is here tls, in [delivery] or a [[route]] ("required" for encrypt, "opportunistic"'
    " for may), and [dane] enabled = true for dane",
    "smtp_tls_wrappermode": 'is here tls = "implicit" in the smart host\'s [[route]]',
    "transport_maps": 'is here a [[route]] for each domain, with domain = "example.net" and next_hop = "host:port"',
    "smtp_tls_policy_maps": "for MTA-STS is here built in, on by default ([mta_sts] enabled)",
    "smtp_tlsrpt_enable": "is here [tls_rpt] enabled = true",
    "myhostname": "is here [smtp] hostname",
    "smtp_helo_name": "is here [delivery] helo_name",
    "smtpd_banner": "is here [smtp] banner (the text after the hostname)",
    "message_size_limit": "is here [smtp] max_message_size",
    "mynetworks": "is here [smtp] relay_networks",
    "smtpd_client_restrictions": "is here the policy hook on_connect ([policy] module) returning Refuse(...)",
    "smtpd_sender_restrictions": "is here the policy hook on_mail_from ([policy] module) returning Refuse(...)",
    "smtpd_recipient_restrictions": "is here the policy hook on_rcpt_to ([policy] module) returning Refuse(...)",
    "header_checks": "is here the policy hook on_message ([policy] module) returning"
    " Changes(remove_headers=[...]) or Refuse(...)",
    "sender_canonical_maps": "is here the policy hook on_message ([policy] module) returning Changes(sender=...)",
    "smtp_destination_concurrency_limit": "is here connection_limit, in [delivery] or per domain or site in"
    " [[shaping]]",
    "smtp_destination_rate_delay": 'is here max_message_rate ("1/s"), in [delivery], [[shaping]] or [[queue]]',
    "maximal_queue_lifetime": "is here [delivery] max_age (or max_age per [[queue]])",
    "delay_warning_time": "is here [delivery] delay_warning (or delay_warning per [[queue]])",
    "bounce_notice_recipient": "has no counterpart here: nothing is mailed to the postmaster (the event log has"
    " it); DSNs come from [delivery] dsn_from",
    "smtp_mx_address_limit": "is here [delivery] mx_address_limit",
    "smtp_mx_session_limit": "is here [delivery] mx_session_limit",
    "hopcount_limit": "is here [smtp] max_hops",
    "disable_mime_output_conversion": "is here [delivery] eight_bit_conversion (true, the default, for = no)",
    "notify_classes": "has no counterpart here: nothing is mailed to the postmaster; refusals and double bounces"
    " are in the event log (pigeon logs; a [[log_hook]] sends them on)",
    "bounce_queue_lifetime": "has no counterpart here: a DSN has the max_age of its recipient's domain's queue"
    " (a [[queue]] block for that domain can shorten it)",
    "recipient_canonical_maps": _NO_RECIPIENT_REWRITING,
    "virtual_alias_maps": _NO_RECIPIENT_REWRITING,
}
"""The main.cf parameters of the README's "Migrating from Postfix", and what takes the place of
each: said when one is written in the file (an unknown key), wherever it is written."""


def _explain(message: str, path: Path, text: str, data: Any = None) -> str:
    """msgspec's `message` about the file `path` as Pigeon says it: the file, line and key (an
    array of tables' by its number), and what was expected in words (`data`: what the file
    decoded to, for the value it holds there)."""
    # A value in a table of free keys (`.headers[...]`): named as the table, the reason as its value's.
    of_a_value = message.endswith("[...]`")
    match = _AT.match(message.replace("[...]`", "`") if of_a_value else message)
    assert match is not None
    reason = match.group("message")
    keys = [k for k in re.split(r"\.|\[\d+\]", match.group("path") or "") if k]
    unknown = _UNKNOWN.match(reason)
    missing = _MISSING.match(reason)
    if missing and not (keys[:1] == ["target"] and missing["field"] == "kind"):  # (a kind: below)
        # At the table that lacks it (`$.http.token[0]`): named as the key itself, in its block.
        table = f"[[{'.'.join(keys)}]]" if _is_array(keys) else f"[{'.'.join(keys)}]"
        keys.append(missing["field"])
        reason = f"missing (every {table} needs one)"
    elif unknown:
        keys.append(unknown.group("field"))
        known = _known_keys(keys[:-1])
        if not keys[:-1]:
            reason = "unknown section" if f"[{keys[-1]}]" in text else "unknown key: keys go under a [section]"
        else:
            reason = "unknown key"
        owners = [
            str(typing.cast(Any, member).__struct_config__.tag)
            for member in _members(_section_type(keys[:-1]))
            if keys[-1] in getattr(member, "__struct_fields__", ())
        ]
        close = difflib.get_close_matches(keys[-1], known, n=1)
        instead = POSTFIX_PARAMETERS.get(keys[-1])
        if instead is not None:
            # Wherever it is written: a key's spelling close to a Postfix name's ("did you mean
            # 'connection_limit'?" for hopcount_limit) would send its user the wrong way.
            reason = reason.split(":", 1)[0]
            reason += f': Postfix\'s {keys[-1]} {instead} (see the README, "Migrating from Postfix")'
        elif owners:  # a [[target]] key of another kind: "did you mean" would name the same key
            reason = f"not a key of this kind (a key of kind {', '.join(map(repr, owners))})"
        elif close:
            reason += f" (did you mean {close[0]!r}?)"
    elif keys[:1] == ["target"] and (reason.startswith("Invalid value") or "field `kind`" in reason):
        kinds = ", ".join(toml_spelling(kind) for kind in _target_kinds())
        if "field `kind`" in reason:
            keys.append("kind")
            reason = f"missing; choose one of {kinds}"
        else:
            reason = f"expected one of {kinds}, got {_chosen(reason, data, match.group('path') or '')}"
    elif keys == ["node", "workers"]:
        # "auto" is the only string: msgspec's "Invalid enum value 'two'; choose one of 'auto'"
        # would hide that a number is the other choice.
        given = _ENUM_VALUE.match(reason)
        reason = 'must be "auto" or a number of worker processes from 1 to 64'
        if given is not None and given["value"].strip().isdigit():
            number = given["value"].strip()
            reason = f'{given["value"]!r} is a string: write the number without quotes (workers = {number}), or "auto"'
        elif given is not None:
            reason = f"{given['value']!r}: {reason}"
    elif reason.startswith("Invalid enum value"):
        choices = ", ".join(toml_spelling(choice) for choice in _choices(keys))
        chosen = _chosen(reason, _NO_VALUE if of_a_value else data, match.group("path") or "")
        reason = f"expected one of {choices}, got {chosen}" if choices else f"{chosen} is not a value this key takes"
    elif reason.startswith("Expected `"):
        reason = _expected_in_words(
            reason, keys, _NO_VALUE if of_a_value else _value_at(data, match.group("path") or "")
        )
    if of_a_value:
        reason = f"each value: {reason}"
    line = _line_of(text, keys)
    name = _key_name(keys)
    block = _BLOCK.match(match.group("path") or "")
    if block is not None:
        # An array of tables ([[dkim]], [[route]], ...): the line of the very block, not the first's.
        index = int(block["index"])
        line = block_line(text, block["section"], index, block["key"] or keys[-1]) or line
        name = _key_name(keys, index)
    where = f"{path}, line {line}" if line else str(path)
    return f"{where}: {name}: {reason}" if name else f"{where}: {reason}"


_MISSING: Final = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_EXPECTED: Final = re.compile(
    r"^Expected `(?P<kind>[^`]+)`(?:, got `(?P<got>[^`]+)`| (?P<op>>=|<=|>|<) (?P<bound>\S+)"
    r"| of length (?P<length_op>>=|<=) (?P<length>\d+)| matching regex (?P<regex>.*))?$",
    re.DOTALL,
)
_KIND_WORDS: Final = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a table",
    "datetime": "a date and time",
    "date": "a date",
    "time": "a time",
}
_BOUND_WORDS: Final = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}
_EXPECTED_OF_KEY: Final = {
    "max_message_rate": 'a rate as a string, such as "100/s", "3000/min" or "100/s,burst=10"',
    "threshold": 'a count over a duration as a string, such as "5/10m"',
    "listen": 'a list, e.g. ["127.0.0.1:2525"], or one string',
    "relay_networks": 'a list, e.g. ["10.0.0.0/8", "::1/128"], or one string',
    "nameservers": 'a list, e.g. ["127.0.0.1:53"], or one string',
}
"""What a key takes, where its type's name would not tell (a rate is a string)."""
_NO_VALUE: Final = object()


def _chosen(reason: str, data: Any, at: str) -> str:
    """The value msgspec's "Invalid enum value 'off'" or "Invalid value 'x'" is about, as the file
    writes it (`data`: what the file decoded to; `at`: msgspec's path to the value)."""
    value = _value_at(data, at)
    if isinstance(value, str):
        return toml_spelling(value[:80])
    given = re.match(r"Invalid (?:enum )?value (?P<value>.*?)(?:; |$)", reason, re.DOTALL)
    return given["value"] if given is not None else "another value"


def _kind_in_words(kind: str) -> str:
    """`int | null` as "a whole number" (TOML has no null: a key left out is the default)."""
    words = [_KIND_WORDS.get(part, f"`{part}`") for part in kind.split(" | ") if part != "null"]
    return " or ".join(dict.fromkeys(words))


def _value_at(data: Any, at: str) -> Any:
    """The value at msgspec's path (`.route[1].domain`) in what the file decoded to."""
    value = data
    for name, index in re.findall(r"\.(\w+)|\[(\d+)\]", at):
        if name and isinstance(value, dict) and name in value:
            value = value[name]
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return _NO_VALUE
    return value


def _shown(value: Any) -> str:
    """A value as the file writes it (`toml_spelling`), for a message: a string cut at 80
    characters; lists and tables (often long, and may hold a secret) not shown."""
    if isinstance(value, str):
        return toml_spelling(value[:80])
    if isinstance(value, list | dict):
        return ""
    return toml_spelling(value)


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _holds_secret(keys: list[str]) -> bool:
    """Whether the key at `keys` holds a secret, or a URL or header that may: what is wrong
    with it is said without its value (`auth_password = 12345678` is one, mistyped). Not a key
    of the same name that takes no string (`[[queue]] dsn`, true or false)."""
    if not keys or not (keys[-1] in SECRET_KEYS or keys[-1] in URL_KEYS or HEADERS_KEY in keys):
        return False
    kind = _section_type(keys)
    members = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    return not all(member in (bool, int, float, type(None)) for member in members)


def _expected_in_words(reason: str, keys: list[str], value: Any) -> str:
    """msgspec's "Expected `int`, got `str`" as "expected a whole number, got a string "x"",
    and its "Expected `int` >= 1" as "must be a whole number of at least 1, got 0"."""
    found = _EXPECTED.match(reason)
    if found is None:
        return reason
    choices = _choices(keys)
    kind = _EXPECTED_OF_KEY.get(keys[-1] if keys else "") or _kind_in_words(found["kind"])
    if choices:
        kind = f"one of {', '.join(toml_spelling(choice) for choice in choices)}"
    tables = found["kind"].startswith("array") and _is_array(keys)  # ([[route]] blocks)
    if tables:
        kind = "a list of tables"
    shown = "" if value is _NO_VALUE or _holds_secret(keys) else _shown(value)
    table = ".".join(keys)
    if found["got"] == "object" and tables:
        # `[route]` for `[[route]]`: TOML's one table where each block is a table of a list.
        return f"expected {kind}, got one table: head each block with [[{table}]] (two brackets), not [{table}]"
    if found["got"] == "array" and found["kind"].startswith("object") and _is_tables(value):
        return f"expected a table, got a list of tables: head it with [{table}] (one bracket), not [[{table}]]"
    if found["got"] is not None:
        if found["got"] == "bool" and shown:
            return f"expected {kind}, got {shown}"  # ("got true", not "got true or false true")
        got = _kind_in_words(found["got"])
        return f"expected {kind}, got {got}{f' {shown}' if shown else ''}"
    if found["op"] is not None:
        return f"must be {kind} of {_BOUND_WORDS[found['op']]} {found['bound']}{f', got {shown}' if shown else ''}"
    if found["length_op"] is not None:  # (the value is not shown: an API token's secret is one)
        unit = "items" if found["kind"] == "array" else "characters"
        return f"must be {kind} of {_BOUND_WORDS[found['length_op']]} {found['length']} {unit}"
    if found["regex"] is not None:
        return f"must be {kind} matching {found['regex']}{f', got {shown}' if shown else ''}"
    return f"expected {kind}"


def _target_kinds() -> list[str]:
    return [str(option.__struct_config__.tag) for option in typing.get_args(TargetConfig)]


def _section_type(keys: list[str]) -> Any:
    kind: Any = Config
    for key in keys:
        # A section that is one of several structs (a [[target]] of any kind): the first that
        # has the key (each kind's own keys are its own; those they share mean the same).
        hints = (typing.get_type_hints(member) for member in _members(kind))
        kind = next((hint[key] for hint in hints if key in hint), None)
        if kind is None:
            return None
        args = typing.get_args(kind)
        if typing.get_origin(kind) is list and args:
            kind = args[0]
    return kind


def _members(kind: Any) -> list[type]:
    """The structs a section's type may be: a union's (`TargetConfig`, `X | None`), or itself."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [member for member in typing.get_args(kind) if isinstance(member, type)]
    return [kind] if isinstance(kind, type) else []


def _known_keys(section: list[str]) -> list[str]:
    fields = (getattr(member, "__struct_fields__", ()) for member in _members(_section_type(section)))
    return list(dict.fromkeys(field for each in fields for field in each))


def _choices(keys: list[str]) -> list[Any]:
    """The values a key of fixed choices takes (`[log] level`: "debug", "info", ...): of a
    list's items for a list (`scopes`); none for another key."""
    kind = _section_type(keys)  # (a list's item type, for a list)
    options = [kind] if typing.get_origin(kind) is Literal else list(typing.get_args(kind))
    found: list[Any] = []
    for option in options:
        if typing.get_origin(option) is Literal:
            found += list(typing.get_args(option))
    return found


def _key_name(keys: list[str], block: int | None = None) -> str:
    """A key as the file writes it: `[smtp] listen`; in an array of tables, `[[route]] #2
    next_hop` (`block`: which table, from 0; None: not known, `[[route]] next_hop`), as the
    README and `pigeon shaping check` name them."""
    keys = [part for key in keys for part in key.split(".")]  # ["http.token", "name"]
    if not keys:
        return ""
    if _is_array(keys):  # the array of tables itself: `[[route]]`, `[[http.token]]`
        return f"[[{'.'.join(keys)}]]"
    if len(keys) == 1:
        return f"[{keys[0]}]" if keys[0] in Config.__struct_fields__ else keys[0]
    section = ".".join(keys[:-1])
    if not _is_array(keys[:-1]):
        return f"[{section}] {keys[-1]}"
    return f"[[{section}]] {keys[-1]}" if block is None else f"[[{section}]] #{block + 1} {keys[-1]}"


def _is_array(section: list[str]) -> bool:
    """Whether `section` (`["route"]`, `["http", "token"]`) is an array of tables."""
    hints: Any = Config
    for position, key in enumerate(section):
        kind = typing.get_type_hints(hints).get(key) if hasattr(hints, "__struct_fields__") else None
        if kind is None:
            return False
        if typing.get_origin(kind) is list:  # (of tables, not of strings: `[smtp] listen`)
            items = _members(typing.get_args(kind)[0]) if typing.get_args(kind) else []
            tables = bool(items) and all(hasattr(item, "__struct_fields__") for item in items)
            return tables and position == len(section) - 1
        hints = kind
    return False


def _line_of(text: str, keys: list[str]) -> int | None:
    """The line where a key is set: best effort, for the error message only."""
    if not keys:
        return None
    section = keys[:-1]
    current: list[str] = []
    section_line: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("["):
            header = line.split("#", 1)[0].strip()  # "[smtp]  # the listener"
            current = [part.strip().strip('"') for part in header.strip("[]").split(".")]
            if current == keys:
                return number
            if current == section:
                section_line = number
            continue
        if "=" not in line:
            continue
        # A dotted key (`smtp.listen = ...` at the top, `tls.x = 1` in a table) sets what its
        # parts name from the table it is in.
        written = current + _dotted(line.split("=", 1)[0])
        if written[: len(keys)] == keys:
            return number
        if section_line is None and section and written[: len(section)] == section:
            section_line = number
    return section_line


def _dotted(name: str) -> list[str]:
    """The parts of a key as a line writes it (`smtp.listen`, `"max_size"`): best effort, for
    messages only (a quoted part holding a dot is split too)."""
    return [part.strip().strip('"').strip("'") for part in name.split(".")]
