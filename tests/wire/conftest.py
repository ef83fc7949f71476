"""Fixtures of the wire tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest


@pytest.fixture
def ends() -> Iterator[tuple[Connection, Connection]]:
    """Two connected ends of a Unix socket pair, as a lane and its caller hold them."""
    a, b = socket.socketpair()
    left, right = Connection(a.detach()), Connection(b.detach())
    yield left, right
    left.close()
    right.close()
