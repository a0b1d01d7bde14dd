"""`serve --chat-template FILE` (vLLM's flag): the file's template replaces the tokenizer's for every chat
request, bad files fail at start naming the flag, and /v1/bundle shows which template answers."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import httpx
import pytest

from modeldeploy.runtime import EngineConfig, generate_cli
from modeldeploy.runtime.chat_template import load_chat_template
from modeldeploy.runtime.server import cli
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy.runtime.tiny_model import CHAT_TEMPLATE
from modeldeploy_dev.harness import ThreadedServer

SYSTEM = "You are the pinned template's fixed system text."
# The tiny model's template with a fixed system turn first: every prompt grows by the same tokens.
PINNED = (
    "{{ bos_token }}<|im_start|>system\n" + SYSTEM + "<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MSGS = [{"role": "user", "content": "where do pods run?"}]


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tpl") / "chat_template.jinja"
    path.write_text(PINNED)
    return path


def _cfg(model_dir: Path, **kw) -> ServerConfig:
    ecfg = EngineConfig(model=str(model_dir), device="cpu", dtype="float32", max_num_seqs=2, bundle_id="ct")
    return ServerConfig(engine=ecfg, served_model_name="tiny", engine_core="thread", **kw)


@pytest.fixture(scope="module")
def servers(llama_dir, template_file):
    """(the tokenizer's template, the pinned file's), both on the same model."""
    with (
        ThreadedServer(_cfg(llama_dir)) as plain,
        ThreadedServer(_cfg(llama_dir, chat_template=load_chat_template(template_file))) as pinned,
    ):
        yield plain, pinned


@pytest.fixture(scope="module")
def tok(llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama_dir)


def chat(s, **kw) -> dict:
    body = {"model": "tiny", "messages": MSGS, "max_tokens": 2, "temperature": 0, **kw}
    r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_file_replaces_the_tokenizer_template(servers, tok):
    plain, pinned = servers
    mine, theirs = chat(pinned, return_token_ids=True), chat(plain, return_token_ids=True)
    text = tok.apply_chat_template(MSGS, chat_template=PINNED, tokenize=False, add_generation_prompt=True)
    assert SYSTEM in text
    expected = tok(text, add_special_tokens=False)["input_ids"]
    assert mine["prompt_token_ids"] == expected  # the model sees the pinned template's rendering
    assert mine["usage"]["prompt_tokens"] == len(expected)
    extra = len(tok(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n", add_special_tokens=False)["input_ids"])
    assert mine["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"] + extra
    # /v1/responses renders through the same template
    r = httpx.post(pinned.url + "/v1/responses", json={"model": "tiny", "input": MSGS[0]["content"],
                                                       "max_output_tokens": 1}, timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] == len(expected)


def test_bundle_shows_the_template_source_and_digest(servers, template_file, tok):
    plain, pinned = servers
    b = httpx.get(pinned.url + "/v1/bundle").json()["chat_template"]
    assert b == {"source": "file", "path": os.path.abspath(template_file), "digest": sha(PINNED)}
    b = httpx.get(plain.url + "/v1/bundle").json()["chat_template"]
    assert tok.chat_template == CHAT_TEMPLATE
    assert b == {"source": "tokenizer", "path": None, "digest": sha(CHAT_TEMPLATE)}


def _serve(tmp_path: Path, model: Path, capsys, template: str) -> str:
    p = argparse.ArgumentParser()
    cli.configure(p)
    args = p.parse_args(["--model", str(model), "--chat-template", template, "--device", "cpu"])
    assert cli.main(args) == 2  # refused before the port opens or the weights load
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "name,content,says",
    [
        ("missing.jinja", None, "no such file"),
        ("empty.jinja", " \n\t\n", "the file is empty"),
        ("bad.jinja", "{% for m in messages %}{{ m['content'] }", "not a valid jinja template: line 1"),
        ("unclosed.jinja", "{% for m in messages %}{{ m.content }}", "not a valid jinja template"),
        ("filter.jinja", "{{ messages | no_such_filter }}", "no filter named 'no_such_filter'"),
        ("latin1.jinja", b"{{ '\xe9' }}", "not utf-8 text"),
        ("a-directory", "dir", "is a directory"),
    ],
)
def test_bad_files_fail_at_start_naming_the_flag(tmp_path, llama_dir, capsys, name, content, says):
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    err = _serve(tmp_path, llama_dir, capsys, str(path))
    assert err.startswith(f"modeldeploy serve: error: --chat-template: {path}: "), err
    assert says in err.lower()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
def test_unreadable_file_fails_at_start(tmp_path, llama_dir, capsys):
    path = tmp_path / "secret.jinja"
    path.write_text(PINNED)
    path.chmod(0)
    err = _serve(tmp_path, llama_dir, capsys, str(path))
    assert "--chat-template" in err and "cannot be read" in err


def test_build_config_carries_the_template(template_file):
    p = argparse.ArgumentParser()
    cli.configure(p)
    cfg = cli.build_config(p.parse_args(["--model", "/m", "--chat-template", str(template_file)]))
    assert cfg.chat_template is not None and cfg.chat_template.text == PINNED
    assert cli.build_config(p.parse_args(["--model", "/m"])).chat_template is None


def test_generate_takes_the_flag_with_chat_only(template_file, tok):
    ids = generate_cli._chat_ids(tok, "hi", PINNED)
    assert SYSTEM in tok.decode(ids) and len(ids) > len(generate_cli._chat_ids(tok, "hi"))
    p = argparse.ArgumentParser()
    generate_cli.configure(p)
    args = p.parse_args(["--model", "/m", "--prompt", "hi", "--chat-template", str(template_file)])
    with pytest.raises(SystemExit, match="--chat-template: only with --chat"):
        generate_cli.main(args)
    args = p.parse_args(["--model", "/m", "--prompt", "hi", "--chat", "--chat-template", "/no/such.jinja"])
    with pytest.raises(SystemExit, match="--chat-template: /no/such.jinja: no such file"):
        generate_cli.main(args)
