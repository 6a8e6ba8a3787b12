"""URLs as they may be recorded or printed: the rule lives in :mod:`specconvert.redact` (low enough for the recipe
schema to use it too); serve-test, bench and the launch scripts import it from here."""

from __future__ import annotations

from ..redact import REDACTED, redact_text, redact_url

__all__ = ["REDACTED", "redact_text", "redact_url"]
