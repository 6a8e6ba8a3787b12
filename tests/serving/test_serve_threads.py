"""`specconvert serve --threads`: a bad value is exit 2 before anything loads."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("args", [["--threads", "0"], ["--threads", "lots"], ["--set", "runtime.threads=-1"]],
                         ids=["zero", "word", "recipe-negative"])
def test_serve_refuses_bad_threads(project, cli, args):
    result = cli("serve", project.recipe_path, "--port", "1", *args)
    assert result.code == 2 and "threads" in result.stderr and "Traceback" not in result.stderr
