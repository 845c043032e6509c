"""``radixlm run NAME``: the terminal chat, driven through a pseudo-terminal, on a tiny
model fetched by hub id from a hub on 127.0.0.1."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

from radixlm.runtime.entrypoints.chat import ChatSession
from tests.runtime.model_store.loopback_hub import LoopbackHub

ENGINE_FLAGS = [
    "--max-total-tokens", "1024", "--no-cpu-layer-kernels", "--attention-backend", "torch",
    "--device", "cpu", "--dtype", "float32",
]  # fmt: skip
START_TIMEOUT_S = 240
TURN_TIMEOUT_S = 60
LONG_REPLY_TOKENS = 200
STATS = re.compile(r"\[prompt (\d+) tokens, (\d+) cached; (\d+) generated\]")


class Terminal:
    """A child process on a pseudo-terminal: what it prints, read with deadlines."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.fd, child = pty.openpty()
        # its own session, with the terminal as its controlling one: Ctrl-C is a SIGINT
        self.proc = subprocess.Popen(
            argv,
            stdin=child,
            stdout=child,
            stderr=child,
            env=env,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(child)
        self.seen = ""

    def read_until(self, marker: str, timeout_s: float) -> str:
        """Everything printed up to and including the next ``marker``."""
        deadline = time.monotonic() + timeout_s
        while marker not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} within {timeout_s} s; printed: {self.seen[-2000:]!r}"
            if select.select([self.fd], [], [], min(left, 1.0))[0]:
                try:
                    self.seen += os.read(self.fd, 4096).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    assert marker in self.seen, self.seen[-2000:]
        head, _, self.seen = self.seen.partition(marker)
        return head + marker

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            os.close(self.fd)


def _run_tiny(hub: LoopbackHub, tmp_path: Path, max_new_tokens: int) -> Terminal:
    """``radixlm run tiny-org/tiny`` (greedy, ``--verbose``) on a terminal of its own."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf")}
    env |= {"HF_HOME": str(tmp_path), "HF_TOKEN": "", "HF_HUB_OFFLINE": "0"}
    argv = [sys.executable, "-m", "radixlm.runtime.entrypoints.cli", "run", "tiny-org/tiny"]
    argv += ["--verbose", "--max-new-tokens", str(max_new_tokens), "--temperature", "0"]
    return Terminal([*argv, *ENGINE_FLAGS], env)


def test_run_chats_over_turns_reusing_the_cache_and_leaves_on_bye(hub_repos, tmp_path) -> None:
    with LoopbackHub(hub_repos[0]) as hub:
        term = _run_tiny(hub, tmp_path, max_new_tokens=6)
        try:
            term.read_until(">>> ", START_TIMEOUT_S)
            term.send("w5 w6 w7\r")
            first = STATS.search(term.read_until(">>> ", TURN_TIMEOUT_S))
            term.send("w8 w9\r")
            second = STATS.search(term.read_until(">>> ", TURN_TIMEOUT_S))
            assert first is not None and second is not None
            prompt_1, cached_1, _ = map(int, first.groups())
            prompt_2, cached_2, _ = map(int, second.groups())
            assert cached_1 == 0 and prompt_2 > prompt_1
            # the second turn's prefill is its new message: the first turn's prompt is cached
            assert cached_2 >= prompt_1
            term.send("\x03")  # Ctrl-C at the prompt: a hint, and the chat goes on
            assert "Use /bye or Ctrl-D to leave." in term.read_until(">>> ", TURN_TIMEOUT_S)
            term.send("/clear\r")
            assert "Cleared the conversation." in term.read_until(">>> ", TURN_TIMEOUT_S)
            term.send("/bye\r")
        finally:
            status = term.close()
        assert status == 0


def test_ctrl_c_mid_reply_returns_to_the_prompt_and_the_chat_goes_on(hub_repos, tmp_path) -> None:
    """Ctrl-C lands while a reply streams: it stops, its turn is forgotten, the next
    turn answers, ``/bye`` exits 0.

    Greedy on the tiny model, "w5 w6 w7" ends (EOS) only after 226 tokens, several
    seconds on a CPU: capped at LONG_REPLY_TOKENS, the reply outlasts the moment the
    test needs to answer its first words with a Ctrl-C. "w8 w9" ends after 24.
    """
    local = hub_repos[1]
    with LoopbackHub(hub_repos[0]) as hub:
        term = _run_tiny(hub, tmp_path, max_new_tokens=LONG_REPLY_TOKENS)
        try:
            term.read_until(">>> ", START_TIMEOUT_S)
            term.send("w5 w6 w7\r")
            term.read_until("w5 w6 w7\r\n", TURN_TIMEOUT_S)  # the terminal's echo
            term.read_until(" w", TURN_TIMEOUT_S)  # the reply streams
            term.send("\x03")
            stopped = term.read_until(">>> ", TURN_TIMEOUT_S)
            assert "^C (reply stopped)" in stopped and STATS.search(stopped) is None
            # the reply's words (the terminal echoes a ^C too, wherever it lands)
            words = stopped.split("^C (reply stopped)")[0].replace("^C", " ").split()
            assert 0 < len(words) < LONG_REPLY_TOKENS - 1
            term.send("w8 w9\r")
            answered = STATS.search(term.read_until(">>> ", TURN_TIMEOUT_S))
            term.send("/bye\r")
        finally:
            status = term.close()
    assert status == 0 and answered is not None
    prompt_tokens, _, generated = map(int, answered.groups())
    # the stopped turn left nothing behind: the prompt is the new message alone
    assert prompt_tokens == _num_chat_tokens(local, "w8 w9") and 0 < generated


def _num_chat_tokens(model_dir: Path, text: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return len(ids["input_ids"])


class _Interrupted:
    """A stream of one chunk, then Ctrl-C (as the terminal delivers it: in the reader)."""

    closed = False

    def __iter__(self) -> Iterator[dict]:
        yield {"delta": "w1", "text": "w1", "meta_info": {}}
        raise KeyboardInterrupt

    def close(self) -> None:
        self.closed = True


class _Engine:
    tokenizer = None

    def __init__(self) -> None:
        self.stream = _Interrupted()

    def generate(self, prompt: str, params: dict, stream: bool) -> _Interrupted:
        return self.stream


def test_ctrl_c_stops_the_reply_and_forgets_its_turn(capsys) -> None:
    engine = _Engine()
    session = ChatSession(engine, {}, out=sys.stdout)  # type: ignore[arg-type]
    lines = iter(["w5 w6", "/bye"])
    assert session.run(lambda prompt: next(lines)) == 0
    assert engine.stream.closed  # the request is aborted
    assert session.messages == []
    assert capsys.readouterr().out == "w1\n^C (reply stopped)\n"
