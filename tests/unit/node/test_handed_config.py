"""What a supervisor hands the workers it starts (`pigeon.node.handed`): the config file's text
as the node started, and as of its last reload whose text loaded; and a worker loads such a
text as if read from the file."""

from __future__ import annotations

import io
from pathlib import Path

from pigeon.config.load import load, load_text, read_text
from pigeon.node import handed
from pigeon.node.supervisor import Supervisor


def _file(tmp_path: Path, hostname: str) -> Path:
    config = tmp_path / "pigeon.toml"
    config.write_text(f'[smtp]\nhostname = "{hostname}"\n[spool]\npath = "var/spool"\n')
    return config


def test_a_text_loads_as_the_file_it_is_of_relative_paths_and_all(tmp_path: Path) -> None:
    config = _file(tmp_path, "started.test")
    from_text = load_text(read_text(config), config)
    assert from_text == load(config)
    assert from_text.spool.path == tmp_path / "var" / "spool"


def test_a_restarted_worker_is_handed_the_last_reload_that_loaded_not_a_broken_file(tmp_path: Path) -> None:
    config = _file(tmp_path, "started.test")
    start = read_text(config)
    supervisor = Supervisor(load(config), config, 2, start_text=start)
    assert supervisor._reloaded_text is None  # no reload yet: the start's text alone
    reloaded = _file(tmp_path, "reloaded.test").read_text()
    supervisor._keep_reloaded()
    assert supervisor._reloaded_text == reloaded
    config.write_text("[smtp\n")  # the workers' reload fails on it too: they keep what they run
    supervisor._keep_reloaded()
    config.write_text("[smtp]\nno_such_key = 1\n")
    supervisor._keep_reloaded()
    assert supervisor._reloaded_text == reloaded
    config.unlink()
    supervisor._keep_reloaded()
    assert supervisor._reloaded_text == reloaded


def test_the_texts_go_to_the_worker_as_they_are() -> None:
    texts = handed.HandedConfig('[smtp]\nhostname = "é.test" # secret = "x"\n', None)
    assert handed.read(io.BytesIO(handed.encode(texts))) == texts
