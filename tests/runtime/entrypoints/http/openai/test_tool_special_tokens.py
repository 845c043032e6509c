"""Tool calls whose markers are special tokens, over real HTTP, on a random model of each
family: the default model's tokenizer with the family's markers added as special tokens,
a chat template that names them (so the server detects the format), and weights edited so
that the section's first marker (``[TOOL_CALLS]``, ``<|tool_call|>``, ``<|python_tag|>``,
``<tool_call>``) is always the likeliest token: under "auto" the model starts a call at
once, as a trained model does when it wants one. The grammar, over the vocabulary variant
that spells the markers, writes the rest; the detokenizer keeps the markers for the
parser; the client gets parsed calls and no marker in the content."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
import torch

from tests.runtime.entrypoints.http.conftest import running_server, wait_idle
from tests.runtime.reasoning.model import CONFIG, ENGINE_OPTIONS

# (architecture, the format the server should detect, the markers made special tokens)
FAMILIES = {
    "mistral": ("MistralForCausalLM", "mistral", ("[TOOL_CALLS]",)),
    "mistral_v11": ("MistralForCausalLM", "mistral_v11", ("[TOOL_CALLS]", "[ARGS]")),
    # radixlm has no Granite decoder of its own: a Llama one with Granite's tokens
    "granite": ("LlamaForCausalLM", "granite", ("<|tool_call|>",)),
    "llama3": ("LlamaForCausalLM", "llama3_json", ("<|python_tag|>",)),
    "hermes": ("Qwen2ForCausalLM", "hermes", ("<tool_call>", "</tool_call>")),
}
# No free strings: a marker spelled in its variant may sit inside a JSON string, and
# this model would write it there; enums, booleans and bounded integers end.
WEATHER = {
    "type": "object",
    "properties": {
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["unit", "days"],
    "additionalProperties": False,
}
ALARM = {
    "type": "object",
    "properties": {"on": {"type": "boolean"}},
    "required": ["on"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_family_model(directory, default_model_dir, markers: tuple[str, ...], arch: str):
    """A random model whose tokenizer has ``markers`` as special tokens and whose
    likeliest token, always, is the first of them."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from radixlm.runtime.models import write_random_model

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir), local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": list(markers)})
    tokenizer.chat_template = "{# tool calls: " + " ".join(markers) + " #}" + _CHATML
    config = {**CONFIG, "architectures": [arch], "vocab_size": len(tokenizer)}
    write_random_model(directory, config, torch.float32, seed=3)
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (directory / stale).unlink(missing_ok=True)
    tokenizer.save_pretrained(str(directory))
    # Residual dimension 0 is large and positive everywhere, so after the final norm it
    # is too; the marker's output row reads it.
    index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    shard = directory / index["lm_head.weight"]
    tensors = load_file(str(shard))
    assert index["model.embed_tokens.weight"] == index["lm_head.weight"]
    tensors["model.embed_tokens.weight"][:, 0] = 30.0
    tensors["lm_head.weight"][tokenizer.convert_tokens_to_ids(markers[0]), 0] = 5.0
    save_file(tensors, str(shard))
    return directory


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, default_model_dir):
    from radixlm import Engine

    arch, fmt, markers = FAMILIES[request.param]
    directory = tmp_path_factory.mktemp(f"tools-{request.param}")
    write_family_model(directory, default_model_dir, markers, arch)
    engine = Engine(model_path=str(directory), **ENGINE_OPTIONS)
    try:
        with running_server(engine) as server:
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
            yield request.param, fmt, markers, server, client
        wait_idle(engine)
    finally:
        engine.shutdown()


def create(client, **fields):
    fields = {"max_tokens": 96, "temperature": 0, "parallel_tool_calls": False, **fields}
    return client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, **fields)


def assert_one_valid_call(choice, markers) -> None:
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    for marker in markers:
        assert marker not in (choice.message.content or ""), choice


def test_the_server_detects_the_family_format(family):
    _, fmt, _, server, _ = family
    info = httpx.get(server.base_url + "/server_info", timeout=60).json()
    assert info["tool_call_format"] == fmt


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_the_marker_token_starts_a_call_that_parses_and_validates(family, tool_choice):
    _, _, markers, _, client = family
    assert_one_valid_call(create(client, tool_choice=tool_choice).choices[0], markers)


def test_streamed_calls_concatenate_to_the_unstreamed_ones(family):
    _, _, markers, _, client = family
    whole = create(client, tool_choice="auto").choices[0]
    calls: dict[int, list[str]] = {}
    content = ""
    for chunk in create(client, tool_choice="auto", stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for entry in delta.tool_calls or []:
            if entry.id is not None:
                calls[entry.index] = [entry.function.name, ""]
            calls[entry.index][1] += entry.function.arguments or ""
    assert content == (whole.message.content or "")
    expected = [[c.function.name, c.function.arguments] for c in whole.message.tool_calls]
    assert list(calls.values()) == expected
    assert_one_valid_call(whole, markers)


def test_without_tools_the_markers_stay_out_of_the_text(family):
    _, _, markers, _, client = family
    reply = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=4, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.content == "" or not any(m in choice.message.content for m in markers), (
        choice
    )
    assert reply.usage.completion_tokens >= 1
