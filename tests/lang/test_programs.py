"""DSL programs on the real default model, once per backend: each primitive and
state method does what it says, so a test fails if its argument were ignored."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import BaseModel, Field

import radixlm as sgl
from radixlm.ir import REGEX_BOOL, REGEX_JSON_STR, REGEX_STR
from tests.lang.user_methods import LeastLikely

GREEDY = {"temperature": 0}


@sgl.function
def chat_gen(s, question, **gen_args):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", **gen_args))


@pytest.mark.parametrize(
    ("question", "gen_args", "whole_text"),
    [
        ("How many legs does a cat have? Answer with a number.", {"dtype": int}, r"[+-]?[0-9]+"),
        ("What is half of 7? Answer with a number.", {"dtype": float}, r"[+-]?[0-9]*\.?[0-9]+"),
        ("Is the sky blue? Answer True or False.", {"dtype": bool}, REGEX_BOOL),
        ("What is the capital of France? Answer with one quoted word.", {"dtype": str}, REGEX_STR),
        (
            "What is the capital of France? Answer with one quoted word.",
            {"regex": REGEX_JSON_STR},
            REGEX_JSON_STR,
        ),
    ],
    ids=["int", "float", "bool", "str", "json_str"],
)
def test_dtypes_constrain_the_text_by_sglangs_regexes(backend, question, gen_args, whole_text):
    """int and float stop at the space or newline their regex allows after the number,
    so the text is the number alone (``int(s[name])`` works)."""
    state = chat_gen.run(question, max_tokens=8, backend=backend, **gen_args, **GREEDY)
    assert re.fullmatch(whole_text, state["answer"]), state["answer"]
    assert state.get_meta_info("answer")["finish_reason"]["type"] == "stop"
    if gen_args.get("dtype") in (int, float):
        gen_args["dtype"](state["answer"])
    if "regex" in gen_args:
        assert isinstance(json.loads(state["answer"]), str)


def test_the_special_token_switch_of_global_config_reaches_the_output(backend, monkeypatch):
    """The prompt ends a finished answer, so the model's next tokens are the end of
    the turn and a new one: shown or left out of the text as global_config says."""

    @sgl.function
    def after_turn(s):
        s += "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
        s += "Hello! How can I help you today?" + sgl.gen("rest", max_tokens=6, ignore_eos=True)

    hidden = after_turn.run(backend=backend, **GREEDY)["rest"]
    monkeypatch.setattr(sgl.global_config, "skip_special_tokens_in_output", False)
    shown = after_turn.run(backend=backend, **GREEDY)["rest"]
    assert "<|im_end|>" in shown
    assert hidden == re.sub(r"<\|(im_start|im_end|endoftext)\|>", "", shown)


def test_max_tokens_stop_and_the_end_of_turn(backend):
    question = "Count from one to twenty in words, separated by commas."
    free = chat_gen.run(question, max_tokens=40, backend=backend, **GREEDY)
    meta = free.get_meta_info("answer")
    assert meta["completion_tokens"] <= 40
    stop = free["answer"].split()[2]  # a word in the middle of the free answer
    cut = chat_gen.run(question, max_tokens=40, stop=stop, backend=backend, **GREEDY)
    assert cut["answer"] == free["answer"][: free["answer"].index(stop)]
    assert cut.get_meta_info("answer")["finish_reason"] == {"type": "stop", "matched": stop}
    exact = chat_gen.run(question, max_tokens=5, ignore_eos=True, backend=backend, **GREEDY)
    assert exact.get_meta_info("answer")["completion_tokens"] == 5
    short = chat_gen.run("Say hi.", max_tokens=60, backend=backend, **GREEDY)
    reason = short.get_meta_info("answer")["finish_reason"]
    if reason["type"] == "stop":  # the turn ended: at the template's end-of-turn token
        assert reason["matched"] in backend.chat_template.stop_token_ids


def test_regex_and_json_schema_constrain_the_text(backend):
    class City(BaseModel):
        name: str = Field(max_length=16)
        is_capital: bool

    state = chat_gen.run(
        "Describe Paris as JSON.", json_schema=City, max_tokens=64, backend=backend, **GREEDY
    )
    City.model_validate_json(state["answer"])
    assert json.loads(state["answer"])["name"]
    code = chat_gen.run("Give a code.", regex=r"[A-Z]{2}-[0-9]{3}", backend=backend, **GREEDY)
    assert len(code["answer"]) == 6 and code["answer"][2] == "-"


def test_select_picks_a_choice_and_reports_each_choices_logprobs(backend):
    @sgl.function
    def pick(s):
        s += sgl.user("Is the sky blue on a clear day? Answer yes or no.")
        s += sgl.assistant(sgl.select("yn", choices=["yes", "no"]))

    state = pick.run(backend=backend)
    meta = state.get_meta_info("yn")
    scores = meta["normalized_prompt_logprobs"]
    assert state["yn"] == ["yes", "no"][scores.index(max(scores))]
    assert len(meta["input_token_logprobs"]) == 2
    assert all(lp < 0 for choice in meta["input_token_logprobs"] for lp, _, _ in choice)


def test_a_user_written_choices_method_decides(backend):
    @sgl.function
    def pick(s, method):
        s += sgl.user("Is the sky blue on a clear day? Answer yes or no.")
        s += sgl.assistant(sgl.select("yn", choices=["yes", "no"], choices_method=method))

    state = pick.run(LeastLikely(), backend=backend)
    meta = state.get_meta_info("yn")
    means = [sum(lp for lp, _, _ in c) / len(c) for c in meta["input"]]
    assert meta["normalized"] == pytest.approx(means) and means[0] != means[1]
    assert state["yn"] == ["yes", "no"][means.index(min(means))]  # the default picks the other
    assert meta["output"] == [[], []] and meta["unconditional"] is None
    unconditional = pick.run(LeastLikely(unconditional=True), backend=backend)
    free = unconditional.get_meta_info("yn")["unconditional"]
    assert [[tok for _, tok, _ in c] for c in free] == [
        [tok for _, tok, _ in c] for c in meta["input"]
    ]
    assert all(c[0][0] is None and all(lp < 0 for lp, _, _ in c[1:]) for c in free)


def test_select_scores_the_whole_prompt_plus_choice_tokenization(backend, engine):
    """The prompt ends in a space that the choices' first token absorbs: every
    choice is scored on tokenize(prompt + choice) from the first token that leaves
    the prompt's own tokenization, and the scores equal the engine's prompt
    logprobs of those whole strings (computed here by hand)."""
    prompt = "The opposite of hot is "
    choices = ["cold", "warm", "blue"]

    @sgl.function
    def pick(s):
        s += prompt
        s += sgl.select("w", choices=choices)

    state = pick.run(backend=backend)
    prompt_ids = backend.tokenize(prompt)
    whole = [backend.tokenize(prompt + c) for c in choices]
    # the boundary merged: " " + "cold" is one token, unlike the prompt's trailing " "
    m = min(next(i for i, (a, b) in enumerate(zip(prompt_ids, w)) if a != b) for w in whole)
    assert m < len(prompt_ids)
    hand = []
    for ids in whole:
        out = engine.generate(
            input_ids=ids,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=m,
        )
        hand.append([(lp, tok, None) for lp, tok, _ in out["meta_info"]["input_token_logprobs"]])
    meta = state.get_meta_info("w")
    got = meta["input_token_logprobs"]
    tokens = [[tok for _, tok, _ in row] for row in got]
    assert tokens == [[tok for _, tok, _ in row] for row in hand]
    # The select scores its choices in one pass, these ran one by one: on a CPU the
    # two may take different product paths (the few-row kernels up to the rows the
    # engine's table gives them, oneDNN past them), the same sums in another order.
    for row, want in zip(got, hand, strict=True):
        assert [lp for lp, _, _ in row] == pytest.approx([lp for lp, _, _ in want], rel=1e-5)
    means = [sum(lp for lp, _, _ in h) / len(h) for h in hand]
    assert state["w"] == choices[means.index(max(means))]


def test_fork_branches_share_the_cached_prefix_and_join_gathers(backend):
    @sgl.function
    def branches(s):
        s += sgl.system("You are a poet. " * 20)  # a prefix worth sharing
        s += sgl.user("Write one word about the sea.")
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += sgl.assistant(sgl.gen("word", max_tokens=4, temperature=0.7 + i / 10))
        forks.join()

    state = branches.run(backend=backend)
    assert isinstance(state["word"], list) and len(state["word"]) == 3
    prefix_tokens = len(backend.tokenize(state.text()))
    metas = state.get_meta_info("word")
    assert all(m["cached_tokens"] >= prefix_tokens - 1 for m in metas)
    assert state.text().endswith("Write one word about the sea.<|im_end|>\n")


def test_streamed_chunks_concatenate_to_the_final_text(backend):
    state = chat_gen.run(
        "Tell a short story about a fox.", max_tokens=40, stream=True, backend=backend, **GREEDY
    )
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text() and len(pieces) > 5
    unstreamed = chat_gen.run(
        "Tell a short story about a fox.", max_tokens=40, backend=backend, **GREEDY
    )
    assert state["answer"] == unstreamed["answer"]


def test_run_batch_preserves_order_and_equals_single_runs(backend):
    questions = [f"What is {a} plus {a}?" for a in range(1, 9)]
    states = chat_gen.run_batch(
        [{"question": q, "max_tokens": 12} for q in questions], backend=backend, **GREEDY
    )
    assert [s.messages()[0]["content"] for s in states] == questions
    single = chat_gen.run(questions[3], max_tokens=12, backend=backend, **GREEDY)
    assert states[3]["answer"] == single["answer"]


def test_return_logprob_fills_the_meta_info(backend):
    state = chat_gen.run(
        "Name a color.",
        max_tokens=4,
        ignore_eos=True,
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
        backend=backend,
        **GREEDY,
    )
    meta = state.get_meta_info("answer")
    assert len(meta["output_token_logprobs"]) == 4
    text = "".join(t for _, _, t in meta["output_token_logprobs"])
    assert text == state["answer"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_server_info_and_cache_of_the_constant_prefix(backend):
    @sgl.function
    def prog(s, q):
        s += sgl.system("Answer in one word. " * 8)
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("a", max_tokens=2))

    prefix = prog.cache(backend)
    assert prefix.startswith("<|im_start|>system\n") and prefix.endswith("<|im_start|>user\n")
    state = prog.run("Why?", backend=backend)
    assert state.get_meta_info("a")["cached_tokens"] >= len(backend.tokenize(prefix)) - 1
    info = sgl.get_server_info(backend)
    assert info["chat_template"] == "model" and info["context_length"] > 0
