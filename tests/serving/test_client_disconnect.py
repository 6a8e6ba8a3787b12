"""Issue 37, item 12: a client that hangs up mid-body costs the server's log one line, not two tracebacks."""

from __future__ import annotations

import asyncio
import logging

import pytest


class _NoEngine:
    """The app reads only ``max_model_len`` before the body is whole; generating would be a bug here."""

    max_model_len = None


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_disconnect_mid_body_logs_one_line_and_no_traceback(path, caplog):
    from specconvert.serving.app import create_app

    app = create_app(_NoEngine())
    events = iter([{"type": "http.request", "body": b'{"prompt": "hal', "more_body": True}, {"type": "http.disconnect"}])
    sent = []

    async def receive():
        return next(events)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"400")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    with caplog.at_level(logging.DEBUG):
        asyncio.run(app(scope, receive, send))  # raised ClientDisconnect before: uvicorn's second traceback
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].exc_info is None and "disconnected" in records[0].getMessage()
    assert "\n" not in records[0].getMessage()
