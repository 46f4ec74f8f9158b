"""A `[[route]]` that authenticates to its smart host (`auth_username`): what loads, and what is
refused at load with an error that names the file, the line, the key and the route, never the
password."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.node.outbound import routes_from
from pigeon.smtp.client_auth import Credentials

PASSWORD = "Hunter2-not-in-errors"
ROUTE = '[[route]]\ndomain = "*"\nnext_hop = "smtp.relay.example:587"\n'


def load_route(tmp_path: Path, keys: str) -> Path:
    path = tmp_path / "pigeon.toml"
    path.write_text(ROUTE + keys)
    return path


def error_of(tmp_path: Path, keys: str, route: str = ROUTE) -> str:
    path = tmp_path / "pigeon.toml"
    path.write_text(route + keys)
    with pytest.raises(ConfigError) as caught:
        load(path)
    said = str(caught.value)
    assert PASSWORD not in said
    return said


def test_a_password_file_is_read_beside_the_config_its_line_end_dropped(tmp_path: Path) -> None:
    (tmp_path / "relay-password").write_text(PASSWORD + "\n")
    config = load(load_route(tmp_path, 'auth_username = "alice"\nauth_password_file = "relay-password"\n'))
    (route,) = routes_from(config)
    assert route.auth == Credentials("alice", PASSWORD, ("PLAIN", "LOGIN"), route="*")
    assert PASSWORD not in repr(route)


def test_mechanisms_are_taken_in_the_order_given_whatever_their_case(tmp_path: Path) -> None:
    config = load(
        load_route(tmp_path, f'auth_username = "a"\nauth_password = "{PASSWORD}"\nauth_mechanisms = ["login"]\n')
    )
    (route,) = routes_from(config)
    assert route.auth is not None and route.auth.mechanisms == ("LOGIN",)


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        (
            f'auth_username = "a"\nauth_password = "{PASSWORD}"\nauth_mechanisms = ["CRAM-MD5"]\n',
            "line 6: [[route]] #1 auth_mechanisms: route '*': 'CRAM-MD5' unknown: "
            "Pigeon authenticates with 'PLAIN', 'LOGIN'",
        ),
        (
            'auth_username = "a"\n',
            "line 4: [[route]] #1 auth_username: route '*' needs auth_password or auth_password_file",
        ),
        (
            f'auth_username = "a"\nauth_password = "{PASSWORD}"\nauth_password_file = "p"\n',
            "[[route]] #1 auth_password_file: route '*': give auth_password or auth_password_file, not both",
        ),
        (
            f'auth_password = "{PASSWORD}"\n',
            "[[route]] #1 auth_password: route '*': auth_password is for a route with auth_username",
        ),
        (
            f'auth_username = "a"\nauth_password = "{PASSWORD}"\ntls = "disabled"\n',
            "[[route]] #1 auth_username: route '*': auth_username with tls = \"disabled\": the password would cross "
            "the network in clear",
        ),
        ('auth_username = "a"\nauth_password = ""\n', "[[route]] #1 auth_password: route '*': the password is empty"),
        (
            'auth_username = "a"\nauth_password_file = "missing"\n',
            "[[route]] #1 auth_password_file: route '*': auth_password_file ",
        ),
        (
            'auth_username = "a\\nb"\nauth_password = "x"\n',
            "[[route]] #1 auth_username: route '*': the user name holds a control character",
        ),
    ],
    ids=[
        "unknown-mechanism",
        "no-password",
        "both",
        "password-without-user",
        "plaintext",
        "empty",
        "no-file",
        "control",
    ],
)
def test_route_auth_mistakes_are_refused_at_load_naming_the_route(tmp_path: Path, keys: str, said: str) -> None:
    assert said in error_of(tmp_path, keys)


def test_auth_is_refused_on_a_route_without_next_hop(tmp_path: Path) -> None:
    said = error_of(tmp_path, f'auth_username = "a"\nauth_password = "{PASSWORD}"\n', route='[[route]]\ndomain = "*"\n')
    assert "[[route]] #1 auth_username: route '*': AUTH is sent only to a smart host: give next_hop" in said


def test_implicit_tls_is_refused_on_a_route_without_next_hop(tmp_path: Path) -> None:
    said = error_of(tmp_path, 'tls = "implicit"\n', route='[[route]]\ndomain = "*"\n')
    assert "[[route]] #1 tls: route '*': tls = \"implicit\" is for a smart host (next_hop" in said


def test_plaintext_auth_loads_when_the_route_allows_it(tmp_path: Path) -> None:
    keys = f'auth_username = "a"\nauth_password = "{PASSWORD}"\ntls = "disabled"\nallow_plaintext_auth = true\n'
    (route,) = routes_from(load(load_route(tmp_path, keys)))
    assert route.auth is not None and route.auth.plaintext


def test_an_empty_password_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "p").write_text("\n")
    said = error_of(tmp_path, 'auth_username = "a"\nauth_password_file = "p"\n')
    assert f"route '*': the password is empty (auth_password_file {tmp_path / 'p'})" in said


@pytest.mark.parametrize("tls", ["", 'tls = "opportunistic"\n', 'tls = "required"\n', 'tls = "implicit"\n'])
def test_plaintext_auth_is_refused_on_a_route_that_may_use_tls(tmp_path: Path, tls: str) -> None:
    # Opportunistic would send the password in clear whenever STARTTLS fails or is stripped.
    said = error_of(tmp_path, f'auth_username = "a"\nauth_password = "{PASSWORD}"\n{tls}allow_plaintext_auth = true\n')
    assert "[[route]] #1 allow_plaintext_auth: route '*': allow_plaintext_auth is only for tls = \"disabled\"" in said


def test_a_route_that_takes_delivery_tls_disabled_is_judged_by_it(tmp_path: Path) -> None:
    # No tls of its own: its connections use [delivery] tls, "disabled" here.
    path = tmp_path / "pigeon.toml"
    keys = f'auth_username = "a"\nauth_password = "{PASSWORD}"\n'
    path.write_text('[delivery]\ntls = "disabled"\n' + ROUTE + keys + "allow_plaintext_auth = true\n")
    (route,) = routes_from(load(path))
    assert route.auth is not None and route.auth.plaintext
    said = error_of(tmp_path, keys, route='[delivery]\ntls = "disabled"\n' + ROUTE)
    assert "route '*': auth_username with tls = \"disabled\" (from [delivery] tls): the password would cross" in said


def test_two_routes_as_one_user_to_one_smart_host_with_different_passwords_are_refused(tmp_path: Path) -> None:
    # They would share a ready queue and its connections (the queue is per user): mail of one
    # route would go authenticated with the other's password.
    first = (
        '[[route]]\ndomain = "a.test"\nnext_hop = "smtp.relay.example:587"\n'
        f'auth_username = "alice"\nauth_password = "{PASSWORD}"\n'
    )
    second = (
        'domain = "b.test"\nnext_hop = "smtp.relay.example:587"\nauth_username = "alice"\nauth_password = "other-one"\n'
    )
    said = error_of(tmp_path, second, route=first + "[[route]]\n")
    assert (
        "route 'b.test': authenticates to smtp.relay.example:587 as 'alice' with another password than route 'a.test'"
        in said
    )
    same = second.replace("other-one", PASSWORD)
    (tmp_path / "pigeon.toml").write_text(first + "[[route]]\n" + same)
    assert len(routes_from(load(tmp_path / "pigeon.toml"))) == 2  # the same password: one queue, as it should


@pytest.mark.parametrize(
    ("first", "second"),
    [("localhost.:587", "localhost:587"), ("[::1]:587", "[0:0:0:0:0:0:0:1]:587"), ("Relay.Test:587", "relay.test:587")],
)
def test_two_spellings_of_one_smart_host_are_one_host_to_the_password_check(
    tmp_path: Path, first: str, second: str
) -> None:
    routes = (
        f'[[route]]\ndomain = "a.test"\nnext_hop = "{first}"\nauth_username = "alice"\nauth_password = "{PASSWORD}"\n'
        f'[[route]]\ndomain = "b.test"\nnext_hop = "{second}"\nauth_username = "alice"\nauth_password = "other-one"\n'
    )
    said = error_of(tmp_path, "", route=routes)
    assert "with another password than route 'a.test'" in said


def test_a_next_hop_is_taken_in_one_spelling_whatever_it_was_written_as(tmp_path: Path) -> None:
    # Two spellings of one host would be two sites: two connection limits, two holds.
    hops = ["Relay.Test.:587", "[0:0:0:0:0:0:0:1]:25", "127.0.0.1:2525", "localhost:25"]
    path = tmp_path / "pigeon.toml"
    path.write_text("".join(f'[[route]]\ndomain = "d{n}.test"\nnext_hop = "{hop}"\n' for n, hop in enumerate(hops)))
    taken = [(route.next_hop.host, route.next_hop.port) for route in routes_from(load(path)) if route.next_hop]
    assert taken == [("relay.test", 587), ("::1", 25), ("127.0.0.1", 2525), ("localhost", 25)]


@pytest.mark.parametrize("username", [" alice", "alice ", "al\\tice", "alice\\u0085"])  # (as TOML writes them)
def test_a_user_name_with_blanks_around_it_or_a_control_character_is_refused(tmp_path: Path, username: str) -> None:
    said = error_of(tmp_path, f'auth_username = "{username}"\nauth_password = "{PASSWORD}"\n')
    assert "[[route]] #1 auth_username: route '*': the user name " in said
