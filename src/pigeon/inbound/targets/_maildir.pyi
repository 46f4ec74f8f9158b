# The Maildir target's batch file work in C (see _maildir.c); maildir.py has the same in Python.
def write_files(
    new_fd: int, names: list[bytes], tmp_fd: int, tmp_names: list[bytes], heads: list[bytes], bodies: list[bytes], /
) -> list[int]: ...
def link_files(
    tmp_fd: int, tmp_names: list[bytes], new_fd: int, names: list[bytes], fds: list[int], /
) -> tuple[int, int]: ...
