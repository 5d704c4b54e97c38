"""listen_wait, the node's side of the launch's wait for MASTER_PORT: real sockets here."""

import json
import socket
import threading
import time

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.torchfleet.cluster.plugins.modules import listen_wait


def _run(capsys, **args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            listen_wait.main()
    return json.loads(capsys.readouterr().out)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_that_opens_while_it_waits_is_seen(capsys):
    port, opened = _free_port(), []
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def open_later():
        time.sleep(0.5)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        opened.append(time.monotonic())

    threading.Thread(target=open_later, daemon=True).start()
    result = _run(capsys, host="127.0.0.1", port=port, timeout=30)
    listener.close()
    # It waited for the port (how fast it saw it is bench/provision.py's to measure).
    assert result["listening"] and not result["changed"] and opened and result["waited_s"] >= 0.4


def test_a_port_that_never_opens_is_not_listening_after_the_timeout(capsys):
    result = _run(capsys, host="127.0.0.1", port=_free_port(), timeout=0.6)
    assert not result["listening"] and not result.get("failed") and result["waited_s"] >= 0.6
