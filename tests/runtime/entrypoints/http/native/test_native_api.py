"""SGLang's native routes over real HTTP on the default model."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from tests.runtime.entrypoints.http.conftest import sse_events, wait_idle

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0, "max_new_tokens": 6}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def test_generate_text_equals_the_engine(http, http_engine):
    out = http.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY}).json()
    expected = http_engine.generate(PROMPT, GREEDY)
    assert out["text"] == expected["text"] and out["output_ids"] == expected["output_ids"]
    meta = out["meta_info"]
    assert meta["finish_reason"] == expected["meta_info"]["finish_reason"]
    assert meta["prompt_tokens"] == expected["meta_info"]["prompt_tokens"]
    assert re.fullmatch("[0-9a-f]{32}", meta["id"])  # random: not guessable


def test_generate_batch_of_input_ids(http, http_engine):
    ids = [http_engine.tokenizer(p)["input_ids"] for p in (PROMPT, "1 2 3")]
    outs = http.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY}).json()
    expected = http_engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert [o["text"] for o in outs] == [e["text"] for e in expected]


def test_generate_stream_is_cumulative(http, http_engine):
    response = http.post(
        "/generate", json={"text": PROMPT, "sampling_params": GREEDY, "stream": True}
    )
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == http_engine.generate(PROMPT, GREEDY)["text"]
    assert "".join(c["delta"] for c in chunks) == texts[-1]
    assert chunks[-1]["meta_info"]["finish_reason"] is not None


def test_logprobs_with_token_texts(http, http_engine):
    body = {
        "text": PROMPT,
        "sampling_params": GREEDY,
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    meta = http.post("/generate", json=body).json()["meta_info"]
    out_lps = meta["output_token_logprobs"]
    assert len(out_lps) == meta["completion_tokens"]
    assert "".join(text for _, _, text in out_lps) == http_engine.generate(PROMPT, GREEDY)["text"]
    assert meta["input_token_logprobs"][0][0] is None  # position 0: no context
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert all(len(top) == 2 and isinstance(top[0][2], str) for top in meta["output_top_logprobs"])


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"regex": "[0-9]{4}"}, lambda t: len(t) == 4 and t.isdigit()),
        ({"choices": ["Paris", "Lyon"]}, lambda t: t in ("Paris", "Lyon")),
        (
            {
                "json_schema": {
                    "type": "object",
                    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                    "required": ["a"],
                    "additionalProperties": False,  # so it ends within max_new_tokens
                }
            },
            lambda t: isinstance(json.loads(t)["a"], int),
        ),
        ({"ebnf": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
    ],
)
def test_constraints(http, constraint, check):
    params = {"max_new_tokens": 24, "temperature": 0, **constraint}
    body = {"text": PROMPT, "sampling_params": params}
    assert check(http.post("/generate", json=body).json()["text"])


def test_bad_sampling_params_are_400(http):
    response = http.post("/generate", json={"text": PROMPT, "sampling_params": {"topp": 1}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "topp"
    response = http.post("/generate", json={"text": PROMPT, "sampling_params": {"regex": "(("}})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_grammar"
    assert http.post("/generate", json={"sampling_params": {}}).status_code == 400


def test_abort_request_ends_a_running_stream(server, http, http_engine):
    body = {
        "text": "Tell a story:",
        "stream": True,
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
    }
    last: list[dict] = []

    def consume():
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            with client.stream("POST", "/generate", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        last.append(json.loads(line[6:]))

    reader = threading.Thread(target=consume)
    reader.start()
    deadline = time.monotonic() + 30
    while not last and time.monotonic() < deadline:
        time.sleep(0.02)
    assert http.post("/abort_request", json={"rid": last[0]["meta_info"]["id"]}).status_code == 200
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert last[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert last[-1]["meta_info"]["completion_tokens"] < 2000
    wait_idle(http_engine)


def test_flush_cache_and_server_info(http, http_engine):
    http.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY})
    wait_idle(http_engine)
    assert http.get("/server_info").json()["internal_states"][0]["kv_cached"] > 0
    assert http.post("/flush_cache").status_code == 200
    info = http.get("/server_info").json()
    assert info["internal_states"][0]["kv_cached"] == 0
    assert info["internal_states"][0]["kv_used"] == 0
    assert info["server"]["api_key"] is None and info["engine"]["dtype"] == "float32"
    placement = info["internal_states"][0]["placement"]
    assert placement == {
        "device": "cpu",
        "attention_backend": http_engine.get_stats().placement.attention_backend,
        "cuda_graph_batch_sizes": [],
        "weights": "float32",
        "weight_bytes": http_engine.get_stats().placement.weight_bytes,
        "tp_size": 1,
        "overlap_schedule": False,  # "auto": on a GPU only
        "grammar_mask_threads": 1,  # None: 1 on the CPU
        "kv_format": "float32",  # kv_cache_dtype "auto": the model's dtype
        "kv_bytes_per_token": info["kv_bytes_per_token"],
    }
    assert http.get("/get_server_info").json()["model_path"] == info["model_path"]


def test_model_info_and_health(http, server):
    info = http.get("/get_model_info").json()
    assert info["model_path"] == str(server.state.model_path) and info["is_generation"] is True
    assert http.get("/health").status_code == 200
    assert http.get("/health_generate").status_code == 200


def test_model_info_as_sglangs_router_reads_it(http, server):
    info = http.get("/model_info").json()
    assert info == http.get("/get_model_info").json()
    assert info["served_model_name"] == server.state.model_name
    assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]


def test_server_info_names_a_model_the_chat_route_accepts(http, server):
    info = http.get("/server_info").json()
    assert info["served_model_name"] == server.state.model_name  # the router's model id
    assert info["dp_size"] == 1
    assert info["max_total_tokens"] == info["internal_states"][0]["kv_capacity"]
    # the default model: 30 layers, 3 KV heads of 64, float32 K and V
    assert info["kv_cache_dtype"] == "float32"
    assert info["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    body = {"model": info["served_model_name"], "messages": [{"role": "user", "content": "Hi"}]}
    response = http.post("/v1/chat/completions", json={**body, "max_tokens": 1})
    assert response.status_code == 200, response.text


def test_get_load_counts_running_and_waiting_work(server, http, http_engine):
    wait_idle(http_engine)
    idle = {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    assert http.get("/get_load").json() == [idle]
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 2000}}
    body["sampling_params"]["ignore_eos"] = True
    rids: list[str] = []

    def consume():
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            with client.stream("POST", "/generate", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {") and not rids:
                        rids.append(json.loads(line[6:])["meta_info"]["id"])

    reader = threading.Thread(target=consume)
    reader.start()
    deadline = time.monotonic() + 30
    while not rids and time.monotonic() < deadline:
        time.sleep(0.02)
    num_prompt_tokens = len(http_engine.tokenizer(PROMPT)["input_ids"])
    # The first token is sampled before it is written to the KV cache: the count passes
    # the prompt's within a decode step or two of the first event.
    for _ in range(300):
        [load] = http.get("/get_load").json()
        assert load["num_reqs"] == 1 and load["num_waiting_reqs"] == 0
        if load["num_tokens"] > num_prompt_tokens:
            break
        time.sleep(0.01)
    assert load["num_tokens"] > num_prompt_tokens  # the prompt and the tokens so far
    assert http.post("/abort_request", json={"rid": rids[0]}).status_code == 200
    reader.join(timeout=30)
    assert not reader.is_alive()
    wait_idle(http_engine)
    assert http.get("/get_load").json() == [idle]


def test_model_info_carries_the_role_blocks_dsl_clients_render(http, http_engine):
    from radixlm.runtime.io.chat_template import ChatTemplate, chat_template_from_tokenizer

    info = http.get("/get_model_info").json()
    template = ChatTemplate.from_dict(info["chat_template"])
    assert template == chat_template_from_tokenizer(http_engine.tokenizer)
    assert info["bos_token"] == http_engine.tokenizer.bos_token


def test_tokenize_and_detokenize_are_the_engines(http, http_engine):
    text = "<|im_start|>user\nHi there<|im_end|>"
    answer = http.post("/tokenize", json={"text": text}).json()
    assert answer["tokens"] == http_engine.tokenizer(text)["input_ids"]
    assert answer["count"] == len(answer["tokens"])
    assert answer["max_model_len"] == http_engine.context_length
    plain = http.post("/tokenize", json={"text": text, "add_special_tokens": False}).json()
    assert plain["tokens"] == http_engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    back = http.post("/detokenize", json={"tokens": answer["tokens"]}).json()
    assert back["text"] == text


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/tokenize", {"text": 5}, "text"),
        ("/tokenize", {"text": "hi", "txt": 1}, "txt"),
        ("/detokenize", {"tokens": [1, 10**9]}, "outside this vocabulary"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
    ],
)
def test_bad_tokenize_bodies_are_400(http, path, body, message):
    response = http.post(path, json=body)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
