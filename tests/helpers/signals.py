"""Child processes that a test interrupts with SIGINT.

A shell without job control starts background commands (``make test &``, ``nohup ... &``) with
SIGINT ignored, children inherit that, and Python then never raises KeyboardInterrupt: a Ctrl-C
test would hang until its timeout for a reason that has nothing to do with the code under test.
``preexec_fn=default_sigint`` gives the child the default disposition a terminal's Ctrl-C meets.
"""

from __future__ import annotations

import signal


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
