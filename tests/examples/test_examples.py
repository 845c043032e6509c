"""Smoke tests of the DSL examples in ``examples/``: each runs its ``main`` with small
parameters on one shared runtime over the default model, and the assertions check
the program's mechanics (structure, constraints, caching), not the model's answers."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import radixlm as sgl

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (the folder is scripts, not a package)."""
    module_name = f"radixlm_examples_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


agent = load_example("agent")
chat = load_example("chat")
few_shot_eval = load_example("few_shot_eval")
json_extraction = load_example("json_extraction")
tree_of_thought = load_example("tree_of_thought")


@pytest.fixture(scope="module")
def runtime(default_model_dir):
    rt = sgl.Runtime(model_path=str(default_model_dir), max_total_tokens=16384)
    yield rt
    rt.shutdown()


# ---- agent.py -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [("3 * 14", 42), ("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("7 / 2", 3.5), ("-2 ** 3", -8)],
)
def test_calculator_evaluates_arithmetic(expression, value):
    assert agent.calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('true')", "x + 1", "abs(-1)", "2 ** 1000", "3 *", "[1, 2]", "'a'"],
)
def test_calculator_rejects_anything_but_arithmetic(expression):
    with pytest.raises(ValueError):
        agent.calculate(expression)


def test_agent_calls_the_calculator_and_reads_its_result(runtime):
    max_steps = 3
    state = agent.main(max_steps=max_steps, backend=runtime)
    calls = state.ret_value
    actions = [state[f"action_{i}"] for i in range(max_steps) if f"action_{i}" in state]
    assert 1 <= len(calls) <= max_steps
    assert 1 <= len(actions) <= max_steps and set(actions) <= set(agent.TOOLS)
    assert actions[: len(calls)] == ["calculator"] * len(calls)
    text = state.text()
    for call in calls:
        # The expression is the constrained gen's text; the observation is what the
        # program's own calculator made of it, appended to the state's text.
        assert call.expression == state[f"input_{call.step}"]
        assert re.fullmatch(agent.EXPRESSION_REGEX, call.expression)
        assert call.observation == agent.format_number(agent.calculate(call.expression))
        assert f"Input: {call.expression}\nObservation: {call.observation}\n" in text
    assert text.count("Observation:") == len(calls) + 1  # + the system prompt's example
    assert "answer" in state and isinstance(state["answer"], str)


# ---- json_extraction.py ---------------------------------------------------------------


def test_json_extraction_validates_against_the_schema(runtime):
    extractions = json_extraction.main(num_passages=2, backend=runtime)
    assert [e.passage for e in extractions] == json_extraction.PASSAGES[:2]
    for extraction in extractions:
        person = json_extraction.Person.model_validate_json(extraction.text)
        assert person == extraction.person


# ---- few_shot_eval.py -----------------------------------------------------------------


def test_few_shot_eval_accuracy_and_prefix_reuse(runtime):
    num_questions = 8
    result = few_shot_eval.main(num_questions=num_questions, backend=runtime)
    questions = few_shot_eval.load_questions(num_questions)
    assert result.questions == questions and len(result.picks) == num_questions
    for pick, question in zip(result.picks, questions):
        assert len(question["choices"]) == 4 and question["answer"] in question["choices"]
        assert pick in question["choices"]
    num_correct = sum(p == q["answer"] for p, q in zip(result.picks, questions))
    assert result.accuracy == num_correct / num_questions
    # Every program's select scores each choice on a prompt that starts with the
    # few-shot prefix; all of them find it in the cache (a boundary token may differ).
    num_prefix_tokens = len(runtime.tokenize(few_shot_eval.FEW_SHOT_PREFIX))
    assert result.num_cached_tokens >= num_questions * 4 * (num_prefix_tokens - 2)
    assert runtime.engine.get_stats().cache_hit_rate > 0


def test_the_question_set_is_well_formed():
    questions = few_shot_eval.load_questions()
    assert len(questions) == 32
    for q in questions:
        assert len(set(q["choices"])) == 4 and q["answer"] in q["choices"]
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", q["question"]).groups()
        assert agent.calculate(f"{a} {op} {b}") == int(q["answer"])


# ---- tree_of_thought.py ---------------------------------------------------------------


def test_tree_of_thought_branches_and_joins(runtime):
    num_branches = len(tree_of_thought.APPROACHES)
    state = tree_of_thought.main(max_tokens=16, backend=runtime)
    assert num_branches == 3
    assert isinstance(state["thought"], list) and len(state["thought"]) == num_branches
    assert all(isinstance(t, str) and t for t in state["thought"])
    assert isinstance(state["verdict"], list) and len(state["verdict"]) == num_branches
    assert set(state["verdict"]) <= {"yes", "no"}
    assert state["best"] in [str(i + 1) for i in range(num_branches)]
    assert state["answer"] and state["answer"] in state.text()
    for i, thought in enumerate(state["thought"]):
        assert f"Idea {i + 1}: {thought.strip()}" in state.text()


# ---- chat.py --------------------------------------------------------------------------


def test_chat_messages_alternate_and_hold_the_answers(runtime):
    state = chat.main(questions=chat.QUESTIONS, max_tokens=16, backend=runtime)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 3
    assert [m["content"] for m in messages[1::2]] == chat.QUESTIONS
    assert [m["content"] for m in messages[2::2]] == [state[f"answer_{i}"] for i in range(3)]
