"""A chat template pinned apart from the tokenizer (vLLM's `--chat-template FILE`).

The file's text replaces the tokenizer's template for every chat request. It is read and compiled once,
at start-up, in the jinja2 environment transformers renders chat templates with, so a missing, empty or
malformed file is an error naming the flag before anything is served, never a 400 on the first request.
Its sha256 identifies the template in /v1/bundle: a template change changes answers.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLAG = "--chat-template"


@dataclass(frozen=True)
class ChatTemplate:
    """A template file's text, and where it was read from (an absolute path)."""

    path: str
    text: str

    @property
    def digest(self) -> str:
        return _sha256(self.text)


def template_digest(template: Any) -> str | None:
    """The "sha256:<hex>" of a template's text (UTF-8); a tokenizer's dict of named templates is hashed as its
    sorted JSON; None when there is no template."""
    if not template:
        return None
    return _sha256(template if isinstance(template, str) else json.dumps(template, sort_keys=True))


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_chat_template(path: str | os.PathLike[str], flag: str = FLAG) -> ChatTemplate:
    """Read and compile a template file: ValueError naming `flag` when it is missing, unreadable, not
    UTF-8, empty (whitespace only) or not a template transformers can compile."""
    if not os.fspath(path):
        raise ValueError(f"{flag}: a file path is required, got ''")
    where = f"{flag}: {os.fspath(path)}"
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{where}: is a directory, not a template file") from None
    except OSError as e:
        raise ValueError(f"{where}: cannot be read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    if not text.strip():
        raise ValueError(f"{where}: the file is empty; a chat template is Jinja text")
    check_compiles(text, where)
    return ChatTemplate(os.path.abspath(path), text)


def check_compiles(text: str, where: str) -> None:
    """Compile `text` exactly as transformers' apply_chat_template does (its cached sandboxed
    environment: trim_blocks, lstrip_blocks, loop controls, the `generation` tag, its filters and
    globals), so the first request renders from the cache and a syntax error surfaces here."""
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template  # pyright: ignore[reportPrivateUsage]

    try:
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{where}: not a valid Jinja template: line {e.lineno}: {e.message}") from None
    except (jinja2.TemplateError, ImportError) as e:
        raise ValueError(f"{where}: the template does not compile: {e}") from None
