"""The shell commands shown in README.md's code blocks, as a test reads them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^ *```(\w*)\n(.*?)^ *```", text, re.S | re.M)]


COMMAND = re.compile(r"^(\$ )?((\.venv/bin/)?fedrift|make|ray|pip|flwr|flower-superlink|flower-supernode|openssl|RAY_\w+=\S+ fedrift) ")


def shell_commands(text: str | None = None) -> list[tuple[list[str], list[str]]]:
    """Every command of the README's shell blocks (continuation lines joined, comments and a
    leading ``$ `` removed, split as the shell would; ``~`` left for the caller), each with
    the output lines shown under it up to the next command."""
    text = README.read_text() if text is None else text
    out: list[tuple[list[str], list[str]]] = []
    for lang, body in code_blocks(text):
        if lang in ("python", "yaml"):
            continue
        shown: list[str] = []
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if COMMAND.match(line):
                shown = []
                out.append((shlex.split(line.removeprefix("$ "), comments=True), shown))
            elif line and out and out[-1][1] is shown:
                shown.append(line)
    return out
