"""Every process radixlm starts runs from any working directory.

A child started as ``python -m`` has its working directory first on ``sys.path``; from
a checkout's root, radixlm's ``kernels/`` folder hid Hugging Face's ``kernels`` from
transformers, and any directory holding a ``torch/`` or ``radixlm/`` does the same.
Here: both command forms of ``python_module_command`` run a module from a directory of
shadowing packages, and ``radixlm serve --dp 2`` (replicas, router, compile workers) and
``--tp 2`` (ranks, compile workers) serve a constrained request when started from that
directory, as the README's ``.venv/bin/radixlm`` command. (The directory holds a
``kernels/`` package as a checkout's root does, so it stands for the repository root
too.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from radixlm.runtime import child_process
from radixlm.runtime.child_process import python_module_command
from radixlm.runtime.models import write_random_model
from tests.servers import free_port

RADIXLM = Path(sys.executable).with_name("radixlm")  # the console script the README runs
START_TIMEOUT_S = 150  # two replicas start side by side on 2 cores
# what the children import first, and the clash they met: each would shadow
# the installed package for a child that has its working directory on sys.path
SHADOWED = ("radixlm", "torch", "transformers", "sglang_router", "json", "runpy")
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}


def write_shadowing_packages(directory: Path) -> Path:
    """A ``kernels/`` package without Hugging Face's API (as at a checkout's root), and
    a package for each name in SHADOWED whose import fails, naming itself."""
    (directory / "kernels").mkdir(parents=True)
    (directory / "kernels" / "__init__.py").write_text('"""not Hugging Face\'s kernels"""\n')
    for name in SHADOWED:
        (directory / name).mkdir()
        message = f"{name} was imported from the working directory"
        (directory / name / "__init__.py").write_text(f"raise ImportError({message!r})\n")
    return directory


@pytest.fixture
def shadowing_dir(tmp_path: Path) -> Path:
    return write_shadowing_packages(tmp_path / "cwd")


@pytest.mark.parametrize("safe_path_flag", [True, False], ids=["-P", "-c bootstrap"])
def test_a_module_runs_without_its_working_directory_on_the_path(
    safe_path_flag, shadowing_dir, monkeypatch
):
    """Both forms (``-P`` on Python 3.11+, the bootstrap on 3.10) run ``json.tool`` from
    a directory whose ``json/`` and ``runpy/`` would shadow the standard library's; a
    relative path in the arguments still resolves against that directory."""
    if safe_path_flag and sys.version_info < (3, 11):
        pytest.skip("-P arrived in Python 3.11")
    monkeypatch.setattr(child_process, "_HAS_SAFE_PATH_FLAG", safe_path_flag)
    (shadowing_dir / "in.json").write_text('{"b": [1, 2]}')
    plain = [sys.executable, "-m", "json.tool", "in.json"]
    shadowed = subprocess.run(plain, cwd=shadowing_dir, capture_output=True, text=True)
    assert "json was imported from the working directory" in shadowed.stderr  # the hazard

    command = python_module_command("json.tool", "in.json")
    done = subprocess.run(command, cwd=shadowing_dir, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"b": [1, 2]}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("tiny"), TINY_LLAMA, torch.float32)


# One kind of child at a time: --dp 2 --tp 2 at once held seven processes beside the test
# process, past the suite's memory budget.
@pytest.mark.parametrize("scale_out", [["--dp", "2"], ["--tp", "2"]], ids=["dp 2", "tp 2"])
def test_dp_and_tp_serve_from_any_working_directory(scale_out, tiny_model, shadowing_dir):
    assert RADIXLM.is_file(), f"no console script at {RADIXLM}: is radixlm installed?"
    cwd = shadowing_dir
    port = free_port()
    argv = ["serve", *scale_out, "--port", str(port), "--model-path"]
    argv += [str(tiny_model), "--max-total-tokens", "1024", "--router-health-check-interval-s", "1"]
    log = shadowing_dir.parent / "launcher.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            [str(RADIXLM), *argv], cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        # the launcher of replicas says when all serve; a single server, by answering
        ready = (lambda: "serving on" in log.read_text()) if "--dp" in scale_out else _health(port)
        _await(lambda: ready() or launcher.poll() is not None)
        assert launcher.poll() is None, log.read_text()[-4000:]
        # a regex: the replica's grammar compile worker joins the processes checked
        body = {"text": "w3 w4", "sampling_params": {"max_new_tokens": 3, "regex": "(w5|w6)+"}}
        reply = httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        output_ids = reply.json()["output_ids"]
        assert output_ids and set(output_ids) <= {5, 6}, reply.json()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0, log.read_text()[-4000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _health(port: int):
    def answers() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    return answers


def _await(condition, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.2)
