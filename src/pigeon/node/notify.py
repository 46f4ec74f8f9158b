"""sd_notify: telling systemd (a `Type=notify` unit) that the node is ready, or stopping.

The protocol is one datagram of `KEY=value` lines to the unix socket named by NOTIFY_SOCKET
(a path, or an abstract name written with a leading "@"). Without that variable, as outside
systemd, nothing is sent. Only the main process notifies: systemd's default NotifyAccess=main
ignores the workers, and the supervisor knows when all of them are ready.
"""

from __future__ import annotations

import logging
import os
import socket

_log = logging.getLogger(__name__)


def sd_notify(*lines: str) -> bool:
    """Send `lines` ("READY=1", "STOPPING=1", "STATUS=...") to systemd; False if there is no
    one to tell or the socket refuses (logged: a notify failure must not stop the node)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(lines).encode())
    except OSError as error:
        _log.warning("cannot notify systemd at %s: %s", os.environ["NOTIFY_SOCKET"], error)
        return False
    return True
