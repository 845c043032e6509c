"""A tool-using agent (ReAct style): think, pick a tool, run it, read the result.

Each step of the loop is three DSL calls and one Python call::

    Thought: <gen, up to the end of the line>
    Action: <select among the tools: calculator | finish>
    Input: <gen constrained by a regex to an arithmetic expression>
    Observation: <what the calculator returned, appended by the program>

The calculator is real: ``calculate`` parses the expression the model wrote with
``ast`` and evaluates only numbers and arithmetic operators (no ``eval``). The
loop ends when the model picks ``finish`` (then it writes the answer; it is offered
once the calculator has answered, as the system prompt asks) or after ``max_steps``
steps. The example in the system prompt teaches a small model the
format; the regex and the select keep every step in it whatever the model writes.

Run: ``.venv/bin/python examples/agent.py``
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

import radixlm as sgl

TOOLS = ["calculator", "finish"]

# One or two operations on plain or decimal numbers: "3 * 14", "120 - 45 / 3".
NUMBER = r"[0-9]{1,5}(\.[0-9]{1,3})?"
EXPRESSION_REGEX = rf"{NUMBER}( [-+*/] {NUMBER}){{1,2}}"

SYSTEM_PROMPT = """\
You solve math word problems with a calculator. Always use the calculator before
you finish. Each step is a Thought, then an Action: calculator or finish.
After "Action: calculator" write the Input, an arithmetic expression; the
Observation is its value. After "Action: finish" write the Answer.

Example:
Question: Pens cost 3 dollars each. How much do 14 pens cost?
Thought: I use the calculator to multiply the price by the number of pens.
Action: calculator
Input: 3 * 14
Observation: 42
Thought: The calculator says 42, so I know the answer.
Action: finish
Answer: 42 dollars"""

QUESTION = "A train travels 60 miles each hour. How far does it travel in 7 hours?"

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression of numbers, + - * / // % ** and parentheses.

    Raises:
        ValueError: anything else (names, calls, huge powers), or a syntax error.
        ZeroDivisionError: a division by zero.
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is over {MAX_EXPONENT}")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"only numbers and arithmetic operators, got {ast.dump(node)}")


def format_number(value: int | float) -> str:
    """``42`` for 42.0: a small model copies an integer more readily."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


@dataclass(frozen=True)
class ToolCall:
    """One calculator call: the expression the model wrote and what came back."""

    step: int
    expression: str
    observation: str


@sgl.function
def react_agent(s, question: str, max_steps: int):
    s += sgl.system(SYSTEM_PROMPT)
    s += sgl.user(f"Question: {question}")
    calls = []
    with s.assistant():
        for step in range(max_steps):
            s += "Thought:" + sgl.gen(f"thought_{step}", max_tokens=32, stop="\n")
            # "finish" only once the calculator has answered: the system prompt's rule,
            # kept by the select as the regex keeps the input
            s += "\nAction: " + sgl.select(f"action_{step}", TOOLS if calls else TOOLS[:1])
            if s[f"action_{step}"] == "finish":
                break
            s += "\nInput: " + sgl.gen(f"input_{step}", regex=EXPRESSION_REGEX, max_tokens=24)
            expression = s[f"input_{step}"]
            try:
                observation = format_number(calculate(expression))
            except (ValueError, ZeroDivisionError) as e:
                observation = f"error: {e}"
            calls.append(ToolCall(step, expression, observation))
            s += f"\nObservation: {observation}\n"
        else:  # out of steps: the agent must answer now
            s += "Thought: I have used all my steps.\nAction: finish"
        s += "\nAnswer:" + sgl.gen("answer", max_tokens=24, stop="\n")
    return calls


def main(question: str = QUESTION, max_steps: int = 4, backend: Any = None) -> sgl.ProgramState:
    """Runs the agent greedily on ``question``; prints its trace and returns the state
    (``state.ret_value``: the ``ToolCall``s in order)."""
    state = react_agent.run(question=question, max_steps=max_steps, backend=backend, temperature=0)
    if (error := state.error()) is not None:
        raise error
    print(state.messages()[-1]["content"])
    print(f"\n{len(state.ret_value)} calculator call(s); answer: {state['answer'].strip()!r}")
    return state


if __name__ == "__main__":
    runtime = sgl.Runtime()
    sgl.set_default_backend(runtime)
    try:
        main()
    finally:
        runtime.shutdown()
