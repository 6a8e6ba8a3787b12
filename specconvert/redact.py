"""URLs as they may be recorded or printed: without the credentials a user put in them.

``--url http://user:secret@host:8000`` is a normal way to reach an endpoint behind basic
auth, and the client needs it as given. Reports, manifests, logs and error messages get
``redact_url(url)`` instead (issue 11, item 21).
A low module (beside `errors`), so the recipe schema can dump URLs redacted too (issue 37).
"""

from __future__ import annotations

import re

REDACTED = "***"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def redact_url(url: str | None) -> str | None:
    """``http://user:pass@host:8000/v1`` -> ``http://***@host:8000/v1``; other URLs unchanged.

    Deliberately blunter than a URL parser: everything between ``://`` and the LAST ``@``
    is hidden, so a password with an unencoded ``@``, ``/``, ``?`` or ``#`` (which parsers
    split in different places) never leaks. A ``@`` later in the path is taken for
    credentials too; hiding a little too much beats writing a password into a report.
    """
    if url is None:
        return None
    text = str(url)
    scheme = _SCHEME.match(text)
    start = scheme.end() if scheme else 0
    at = text.rfind("@", start)
    if at < 0:
        return text
    return text[:start] + REDACTED + text[at:]


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_text(text: str) -> str:
    """Every URL inside ``text`` (an error message a library wrote) through :func:`redact_url`."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)) or "", str(text))
