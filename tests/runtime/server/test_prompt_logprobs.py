"""prompt_logprobs (vLLM's teacher-forced prompt scores), continue_final_message and the legacy echo.

The engine's scores are held to transformers' float32 log_softmax of the same prompt, across prompts
longer than one prefill chunk, with the prefix cache warm, under tensor parallelism, and through both
engine clients of the real server (HTTP). The chat rendering is held to transformers'
apply_chat_template. These are the contract the operator's quality gate scores answers with.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from modeldeploy.runtime import LLM, EngineConfig, SamplingParams
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer

TOL = 1e-4
LONG = [(i * 37 + 11) % 500 + 6 for i in range(150)]  # 150 tokens: several chunks of 32


def hf_log_softmax(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: transformers' float32 log-distribution after each prefix (teacher forcing)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_against(ref: torch.Tensor, ids: list[int], entries: list, k: int) -> None:
    """Each entry (engine PromptLogprob) is token p+1 scored by the distribution after position p."""
    assert len(entries) == len(ids) - 1
    for p, e in enumerate(entries):
        row, tok = ref[p], ids[p + 1]
        assert e.token_id == tok
        assert abs(e.logprob - row[tok].item()) < TOL, f"position {p + 1}"
        assert e.rank == int((row > row[tok]).sum()) + 1
        top_v, top_i = row.topk(k)
        assert [i for i, _ in e.top] == top_i.tolist()
        assert torch.allclose(torch.tensor([v for _, v in e.top]), top_v, atol=TOL)


@pytest.fixture(scope="module")
def ref(llama_dir) -> torch.Tensor:
    return hf_log_softmax(llama_dir, LONG)


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_engine_prompt_logprobs_match_transformers_across_chunks(llama_dir, ref, tp):
    llm = LLM(llama_dir, dtype="float32", max_num_batched_tokens=32, block_size=16, tensor_parallel_size=tp)
    # The same prompt unscored first: its blocks are in the prefix cache, which a scored request must
    # not use (a cached block's positions would go unscored). A plain request rides along in the batch.
    plain = SamplingParams(max_tokens=2, temperature=0.0)
    llm.generate(LONG, plain)
    scored = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=5)
    outs = llm.generate([LONG, LONG[:20]], [scored, plain])
    assert outs[0].metrics.prefill_chunks > 1  # the prompt really spanned several prefill chunks
    check_against(ref, LONG, outs[0].prompt_logprobs, 5)
    assert outs[1].prompt_logprobs is None  # not asked: nothing computed or carried
    # The greedy output is the same with or without scoring.
    assert outs[0].token_ids == llm.generate(LONG, SamplingParams(max_tokens=3, temperature=0.0))[0].token_ids


def test_engine_prompt_logprobs_k0_n2_and_preemption(llama_dir, ref):
    """k=0: the actual token alone; n=2: choice 0 carries the prompt's scores; blocks so few that
    sequences are preempted and recomputed: the scores are neither lost nor doubled."""
    llm = LLM(llama_dir, dtype="float32", max_num_batched_tokens=32, block_size=16)
    outs = llm.generate(LONG, SamplingParams(max_tokens=2, temperature=0.8, seed=1, n=2, prompt_logprobs=0))
    check_against(ref, LONG, outs[0].prompt_logprobs, 0)
    assert outs[1].prompt_logprobs is None
    tight = LLM(
        llama_dir,
        dtype="float32",
        max_num_batched_tokens=32,
        block_size=16,
        num_kv_blocks=16,
        max_model_len=256,
    )
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
    outs = tight.generate([LONG[:100]] * 3, params)
    assert tight.engine.scheduler.preemptions_total > 0
    for out in outs:
        check_against(ref, LONG[:100], out.prompt_logprobs, 1)


def test_prompt_logprobs_is_validated():
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad).validate()


# ---- the server, over HTTP ----------------------------------------------------------------------
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "where do pods run?"}]
ANSWER = "Pods run on the nodes of the cluster"


def _server_cfg(model_dir: Path, layout: str) -> ServerConfig:
    ecfg = EngineConfig(
        model=str(model_dir),
        device="cpu",
        dtype="float32",
        max_num_seqs=4,
        max_num_batched_tokens=16,  # every chat prompt here spans several prefill chunks
        bundle_id="pl",
    )
    return ServerConfig(engine=ecfg, served_model_name="tiny", engine_core=layout)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=["process", "thread"])
def server(request, llama_dir):
    with ThreadedServer(_server_cfg(llama_dir, request.param)) as s:
        yield s


@pytest.fixture(scope="module")
def tok(llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama_dir)


def hf_chat_ids(tok, msgs, **kw) -> list[int]:
    out = tok.apply_chat_template(msgs, tokenize=True, **kw)
    ids = out["input_ids"] if not isinstance(out, list) else out
    return list(ids)


def post(s, path: str, body: dict) -> httpx.Response:
    return httpx.post(s.url + path, json={"model": "tiny", **body}, timeout=120)


def ids_of(prompt_logprobs: list) -> list[int]:
    """The prompt's token ids 1.. as the scores name them (each entry's first key is the actual token)."""
    return [int(next(iter(e))) for e in prompt_logprobs[1:]]


def test_chat_continue_final_message_scores_match_transformers(server, tok, llama_dir):
    convo = [*MSGS, {"role": "assistant", "content": ANSWER}]
    expected = hf_chat_ids(tok, convo, continue_final_message=True, add_generation_prompt=False)
    closed = hf_chat_ids(tok, convo, add_generation_prompt=False)
    assert closed[: len(expected)] == expected and len(closed) > len(expected)  # the turn is left open
    r = post(
        server,
        "/v1/chat/completions",
        {
            "messages": convo,
            "continue_final_message": True,
            "add_generation_prompt": False,
            "prompt_logprobs": 3,
            "max_tokens": 1,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    pl = body["prompt_logprobs"]
    assert len(pl) == body["usage"]["prompt_tokens"] == len(expected)
    assert pl[0] is None and ids_of(pl) == expected[1:]  # the same ids as transformers' rendering
    ref = hf_log_softmax(llama_dir, expected)
    for p, entry in enumerate(pl[1:]):
        row, actual = ref[p], expected[p + 1]
        mine = entry[str(actual)]
        assert abs(mine["logprob"] - row[actual].item()) < TOL
        assert mine["rank"] == int((row > row[actual]).sum()) + 1
        assert mine["decoded_token"] == tok.decode([actual])
        top = row.topk(3).indices.tolist()
        assert set(entry) == {str(actual), *map(str, top)}
        for rank, t in enumerate(top, start=1):
            if t != actual:
                assert entry[str(t)]["rank"] == rank and abs(entry[str(t)]["logprob"] - row[t].item()) < TOL


def test_scorer_flow_answer_positions_follow_the_plain_prompt(server, tok):
    """The quality gate's recipe: usage.prompt_tokens of the plain request marks where the answer
    starts inside the continued conversation's scores."""
    plain = post(server, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 4, "temperature": 0})
    n_plain = plain.json()["usage"]["prompt_tokens"]
    convo = [*MSGS, {"role": "assistant", "content": ANSWER}]
    body = {"messages": convo, "continue_final_message": True, "add_generation_prompt": False}
    r = post(server, "/v1/chat/completions", {**body, "prompt_logprobs": 0, "max_tokens": 1})
    pl = r.json()["prompt_logprobs"]
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"]
    assert ids_of(pl)[n_plain - 1 :] == answer
    assert all(len(e) == 1 for e in pl[1:])  # k=0: the actual token only


def test_chat_plain_request_has_no_prompt_logprobs(server):
    r = post(server, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
    assert r.status_code == 200 and "prompt_logprobs" not in r.json()


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/chat/completions", {"messages": [*MSGS, {"role": "assistant", "content": "x"}],
                                  "continue_final_message": True}, "continue_final_message"),
        ("/v1/chat/completions", {"messages": MSGS, "continue_final_message": True,
                                  "add_generation_prompt": False}, "continue_final_message"),
        ("/v1/chat/completions", {"messages": MSGS, "prompt_logprobs": 21}, "prompt_logprobs"),
        ("/v1/chat/completions", {"messages": MSGS, "prompt_logprobs": -1}, "prompt_logprobs"),
        ("/v1/chat/completions", {"messages": MSGS, "prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
        ("/v1/chat/completions", {"messages": MSGS, "add_generation_prompt": "yes"}, "add_generation_prompt"),
        ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "echo": True, "stream": True}, "echo"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ],
)  # fmt: skip
def test_bad_combinations_are_400_naming_the_field(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_completions_prompt_logprobs_and_echo_scoring(server, tok, llama_dir):
    ids = LONG[:40]
    ref = hf_log_softmax(llama_dir, ids)
    r = post(
        server, "/v1/completions", {"prompt": ids, "prompt_logprobs": 2, "max_tokens": 2, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    pl = choice["prompt_logprobs"]  # vLLM's place for completions: in the choice
    assert len(pl) == r.json()["usage"]["prompt_tokens"] == len(ids) and ids_of(pl) == ids[1:]
    assert all(
        abs(e[str(ids[p + 1])]["logprob"] - ref[p, ids[p + 1]].item()) < TOL for p, e in enumerate(pl[1:])
    )
    # The legacy scoring idiom: echo the prompt with its logprobs, generate nothing.
    r = post(server, "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    c = body["choices"][0]
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(ids)
    assert c["text"] == tok.decode(ids) and "prompt_logprobs" not in c
    lps = c["logprobs"]
    assert (
        len(lps["tokens"]) == len(ids) and lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
    )
    for p in range(len(ids) - 1):
        assert abs(lps["token_logprobs"][p + 1] - ref[p, ids[p + 1]].item()) < TOL
        best = int(ref[p].argmax())
        assert abs(lps["top_logprobs"][p + 1][tok.decode([best])] - ref[p, best].item()) < TOL
    # echo with a completion: the prompt then the output, text and logprobs.
    r = post(server, "/v1/completions", {"prompt": "The quick brown", "echo": True, "logprobs": 0,
                                         "max_tokens": 3, "temperature": 0})  # fmt: skip
    c = r.json()["choices"][0]
    n_prompt = r.json()["usage"]["prompt_tokens"]
    assert c["text"].startswith("The quick brown")
    assert len(c["logprobs"]["tokens"]) == n_prompt + r.json()["usage"]["completion_tokens"]
    assert c["logprobs"]["token_logprobs"][0] is None and None not in c["logprobs"]["token_logprobs"][1:]


def test_openai_client_passes_the_params_in_extra_body(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(
        model="tiny",
        messages=[*MSGS, {"role": "assistant", "content": ANSWER}],  # type: ignore[list-item]
        max_tokens=1,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "prompt_logprobs": 1},
    )
    pl = (r.model_extra or {})["prompt_logprobs"]
    assert len(pl) == r.usage.prompt_tokens and pl[0] is None  # type: ignore[union-attr]
    c = client.completions.create(model="tiny", prompt="The quick brown", max_tokens=0, echo=True, logprobs=0)
    assert c.choices[0].text == "The quick brown" and c.usage.completion_tokens == 0  # type: ignore[union-attr]
