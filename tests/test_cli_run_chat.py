"""``llamacpy chat`` driven by another program on a pty: streamed replies with the chat
template, ``\\``-continued input lines, Ctrl-C stopping a reply (not the program), /exit."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from llamacpy.cli.chat import read_message

LAUNCH = "import sys; from llamacpy import cli; sys.exit(cli.main(sys.argv[1:]))"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Pty:
    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        # Ctrl-C as a terminal delivers it, whatever this process inherited (a background
        # job of a non-interactive shell starts with SIGINT ignored, and so would the child)
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *args], stdin=slave,
                                     stdout=slave, stderr=subprocess.PIPE, close_fds=True,
                                     preexec_fn=_default_sigint)  # fmt: skip
        os.close(slave)
        self.buf = b""

    def read_until(self, marker: bytes, timeout: float = 300) -> bytes:
        end = time.monotonic() + timeout
        while marker not in self.buf:
            ready, _, _ = select.select([self.master], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no {marker!r} in {self.buf!r}")
            self.buf += os.read(self.master, 4096)
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> tuple[int, str]:
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        err = self.proc.stderr.read().decode()
        os.close(self.master)
        return code, err


def test_chat_on_a_pty(smollm2_path):
    chat = Pty(["chat", "-m", str(smollm2_path), "-c", "512", "-t", "1", "--temp", "0",
                "-n", "400"])  # fmt: skip
    try:
        chat.read_until(b"> ")
        chat.send("What is the capital of France?\n")
        # the answer llama-cpp-python's chat completion gives (greedy, GGUF template) streams
        chat.read_until("L'\u00c9toile, la".encode())
        chat.proc.send_signal(signal.SIGINT)  # Ctrl-C stops the reply, not the program
        assert b"[interrupted]" in chat.read_until(b"\r\n> ")
        chat.send("/clear\n")
        chat.read_until(b"> ")
        chat.send("What is the capital\\\n of France?\n")  # one message on two lines
        reply = chat.read_until(b"\r\n> ")
        assert reply.endswith(b"of France?\r\nThe capital of France is Paris.\r\n> ")
        chat.send("/exit\n")
    finally:
        code, err = chat.close()
    assert code == 0, err
    assert "Traceback" not in err and "error" not in err


def test_read_message_joins_continued_lines():
    import io

    inp = io.StringIO("first\\\nsecond\nthird\n")
    out = io.StringIO()
    assert read_message(inp, out) == "first\nsecond"
    assert read_message(inp, out) == "third"
    assert read_message(inp, out) is None
    assert out.getvalue() == "> > > "


@pytest.mark.parametrize("text", ["/exit\n", ""])
def test_exit_and_end_of_input(text):
    import io

    msg = read_message(io.StringIO(text), io.StringIO())
    assert msg is None or msg.strip() == "/exit"


def test_chat_names_the_template_it_falls_back_to():
    from types import SimpleNamespace

    from llamacpy.cli.chat import template_note

    assert template_note(SimpleNamespace(chat_templates={"": "{{ x }}"})) is None
    assert "ChatML" in template_note(SimpleNamespace(chat_templates={}))
    assert "ChatML" in template_note(SimpleNamespace(chat_templates={"": "chatml"}))
    assert "tool_use" in template_note(SimpleNamespace(chat_templates={"tool_use": "{{ x }}"}))
