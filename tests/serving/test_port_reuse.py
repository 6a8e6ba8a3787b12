"""`port_in_use`: a port whose last server stopped with a client connected (TIME-WAIT) is free to bind."""

from __future__ import annotations

import socket
import sys

import pytest

from specconvert.serving.process import port_in_use


def _time_wait_port() -> int:
    """A loopback port with a connection in TIME-WAIT and nothing listening (the server side closed first)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the active closer keeps the 4-tuple in TIME-WAIT for 60 s
    listener.close()
    client.recv(1)  # read the FIN, then close: the server side moves to TIME-WAIT
    client.close()
    return port


def test_a_time_wait_port_is_free_and_a_listening_one_is_taken():
    port = _time_wait_port()
    # Without SO_REUSEADDR the bind fails here: that is the situation the check must not refuse.
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", port))
        time_wait_blocks_plain_bind = False
    except OSError:
        time_wait_blocks_plain_bind = True
    finally:
        probe.close()
    assert time_wait_blocks_plain_bind, "the fixture did not leave a TIME-WAIT socket"
    assert not port_in_use("127.0.0.1", port)

    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(("127.0.0.1", port))
    listening.listen(1)
    try:
        assert port_in_use("127.0.0.1", port)
    finally:
        listening.close()


HEALTHY = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
TAKEN = "import sys; print('OSError: [Errno 98] Address already in use', flush=True); sys.exit(1)"


def test_the_one_start_loop_retries_a_port_taken_meanwhile(tmp_path):
    """serve-test, bench and tune start servers through serving.process.start_healthy: a picked port that another
    process took before the server bound it is retried once on another port."""
    from specconvert.serving.process import ServerStartError, start_healthy

    tried, retried = [], []

    def command(port):
        tried.append(port)
        return [sys.executable, "-c", TAKEN if len(tried) == 1 else HEALTHY, str(port)]

    server, url, took = start_healthy(command, lambda p: f"http://127.0.0.1:{p}", tmp_path / "s.log", 30,
                                      on_retry=retried.append)
    try:
        assert len(tried) == 2 and retried == tried[:1] and url.endswith(f":{tried[1]}") and server.alive()
    finally:
        server.stop()
    # a fixed port is the user's: no second try, and the error says the port is taken
    with pytest.raises(ServerStartError, match="is in use"):
        start_healthy(lambda p: [sys.executable, "-c", TAKEN], lambda p: f"http://127.0.0.1:{p}", tmp_path / "f.log",
                      30, port=tried[0])
