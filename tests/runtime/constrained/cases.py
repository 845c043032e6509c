"""Real-world constraints that constrained-decoding tests and benchmarks run.

Each ``ConstraintCase`` carries the sampling-params constraint (``params()``), a prompt
that asks the default model (SmolLM2-135M-Instruct) for such an output, examples on
both sides of the constraint, and ``check``: an oracle independent of any grammar
backend (``re.fullmatch``, ``jsonschema``, a hand-written recogniser for EBNF).

Invariants every case keeps (``test_cases.py`` holds them):

- every string a backend may generate passes ``check``: the grammar is never looser
  than the oracle. So no ``format: date`` (xgrammar allows 2024-02-30, jsonschema does
  not) nor ``format: ipv4`` (xgrammar allows ``01.2.3.4``, Python does not); and a
  string with a ``pattern`` or a ``format`` has no other constraint (xgrammar 0.2.9
  then ignores ``pattern`` beside ``format``, and ``minLength``/``maxLength`` beside
  either).
- valid JSON examples are compact (``{"a":1,"b":2}``) and keep the schema's property
  order: the text the runtime's xgrammar backend (separators ``,`` ``:``) generates.
- regexes use explicit classes (``[0-9]``, not ``\\d``: Python's ``\\d`` matches any
  Unicode digit) and no anchors, lookaround or backreferences: they feed an FSM.
- JSON objects say ``additionalProperties: false``; string ``maxLength`` <= 40.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

__all__ = [
    "KINDS",
    "ConstraintCase",
    "CASES",
    "REGEX_CASES",
    "JSON_CASES",
    "EBNF_CASES",
    "CHOICE_CASES",
    "find_case",
]

KINDS = ("regex", "json_schema", "ebnf", "choices")
# Draft 2020-12's own checker, not a bare FormatChecker(): the bare one also carries
# draft 3's "time" (%H:%M:%S), which rejects RFC 3339 times such as "12:00:00Z".
_FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


@dataclass(frozen=True)
class ConstraintCase:
    """One constraint with its prompt and examples.

    Attributes:
        name: unique, stable (benchmarks select cases by name).
        kind: one of ``KINDS``; the sampling-params key.
        spec: the regex, the JSON schema (a dict), the EBNF grammar (root rule ``root``)
            or the list of choices.
        prompt: a user message that naturally asks for such an output.
        valid: outputs that satisfy the constraint.
        invalid: near misses that must be rejected.
        recognizer: EBNF only: a hand-written recogniser of the grammar's language.
    """

    name: str
    kind: str
    spec: Any = field(hash=False)
    prompt: str
    valid: tuple[str, ...]
    invalid: tuple[str, ...]
    recognizer: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"case {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if not self.valid or not self.invalid:
            raise ValueError(
                f"case {self.name!r}: needs at least one valid and one invalid example"
            )
        if (self.kind == "ebnf") != (self.recognizer is not None):
            raise ValueError(
                f"case {self.name!r}: a recognizer is required for ebnf, and only there"
            )
        _SPEC_CHECKS[self.kind](self)

    def params(self) -> dict[str, Any]:
        """The sampling params that impose the constraint: ``{kind: spec}`` (a copy)."""
        return {self.kind: copy.deepcopy(self.spec)}

    def check(self, text: str) -> None:
        """Raises AssertionError, saying what was expected, if ``text`` breaks the constraint."""
        _CHECKERS[self.kind](self, text)


def _validate_regex_spec(case: ConstraintCase) -> None:
    if not isinstance(case.spec, str):
        raise ValueError(f"case {case.name!r}: a regex spec is a str, got {case.spec!r}")
    re.compile(case.spec)


def _validate_schema_spec(case: ConstraintCase) -> None:
    if not isinstance(case.spec, dict):
        raise ValueError(f"case {case.name!r}: a json_schema spec is a dict, got {case.spec!r}")
    jsonschema.Draft202012Validator.check_schema(case.spec)


def _validate_ebnf_spec(case: ConstraintCase) -> None:
    if not isinstance(case.spec, str) or not re.search(r"^root ::=", case.spec, re.M):
        raise ValueError(f"case {case.name!r}: an ebnf spec is a str defining 'root ::='")


def _validate_choices_spec(case: ConstraintCase) -> None:
    spec = case.spec
    if not isinstance(spec, list) or not spec or not all(isinstance(c, str) and c for c in spec):
        raise ValueError(f"case {case.name!r}: choices are a non-empty list of non-empty str")
    if len(set(spec)) != len(spec):
        raise ValueError(f"case {case.name!r}: duplicate choices in {spec!r}")


# The checks raise AssertionError themselves: a bare assert would vanish under python -O.
def _check_regex(case: ConstraintCase, text: str) -> None:
    if not re.fullmatch(case.spec, text):
        raise AssertionError(
            f"case {case.name!r}: {text!r} does not fully match the regex {case.spec!r}"
        )


def _check_json_schema(case: ConstraintCase, text: str) -> None:
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_nan)
    except ValueError as e:  # JSONDecodeError included
        raise AssertionError(f"case {case.name!r}: {text!r} is not valid JSON: {e}") from None
    validator = jsonschema.Draft202012Validator(case.spec, format_checker=_FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise AssertionError(
            f"case {case.name!r}: {text!r} breaks the schema at {where}: {error.message}"
        )


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"duplicate keys {duplicates}")
    return dict(pairs)


def _no_nan(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _check_ebnf(case: ConstraintCase, text: str) -> None:
    if case.recognizer is None or not case.recognizer(text):
        raise AssertionError(
            f"case {case.name!r}: {text!r} is not derived from the grammar's root rule:\n"
            f"{case.spec}"
        )


def _check_choices(case: ConstraintCase, text: str) -> None:
    if text not in case.spec:
        raise AssertionError(f"case {case.name!r}: {text!r} is not one of {case.spec!r}")


_SPEC_CHECKS: dict[str, Callable[[ConstraintCase], None]] = {
    "regex": _validate_regex_spec,
    "json_schema": _validate_schema_spec,
    "ebnf": _validate_ebnf_spec,
    "choices": _validate_choices_spec,
}
_CHECKERS: dict[str, Callable[[ConstraintCase, str], None]] = {
    "regex": _check_regex,
    "json_schema": _check_json_schema,
    "ebnf": _check_ebnf,
    "choices": _check_choices,
}


# ---------------------------------------------------------------------------- regexes

EMAIL = r"[A-Za-z0-9._%+-]{1,32}@([A-Za-z0-9-]{1,32}\.){1,3}[A-Za-z]{2,10}"
ISO_DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"  # 0-255, no leading zero
IPV4 = rf"({_OCTET}\.){{3}}{_OCTET}"
US_PHONE = r"\([2-9][0-9]{2}\) [2-9][0-9]{2}-[0-9]{4}"  # NANP: area and exchange start 2-9
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

REGEX_CASES: tuple[ConstraintCase, ...] = (
    ConstraintCase(
        "email_address",
        "regex",
        EMAIL,
        "Suggest an email address for a bakery called Sunny Buns.",
        valid=("hello@sunnybuns.com", "orders+web@mail.sunny-buns.co.uk"),
        invalid=("hello@sunnybuns", "hello sunnybuns.com", "hello@@sunnybuns.com", "a@sunnybuns.c"),
    ),
    ConstraintCase(
        "iso_date",
        "regex",
        ISO_DATE,
        "On what date did the first person walk on the Moon? Answer as YYYY-MM-DD.",
        valid=("1969-07-20", "2024-12-31"),
        invalid=("1969-7-20", "1969/07/20", "1969-13-20", "1969-07-32", "1969-00-20", "69-07-20"),
    ),
    ConstraintCase(
        "ipv4_address",
        "regex",
        IPV4,
        "What is the IP address of a typical home router?",
        valid=("192.168.1.1", "10.0.0.254", "255.255.255.255", "0.0.0.0"),
        invalid=("192.168.1.256", "300.1.1.1", "192.168.01.1", "192.168.1", "1.2.3.4.5"),
    ),
    ConstraintCase(
        "us_phone",
        "regex",
        US_PHONE,
        "Give a US phone number for a pizza place, formatted like (212) 555-0187.",
        valid=("(212) 555-0187", "(415) 867-5309"),
        invalid=("212-555-0187", "(112) 555-0187", "(212) 555-018", "(212)555-0187"),
    ),
    ConstraintCase(
        "uuid",
        "regex",
        UUID,
        "Generate a random UUID in lowercase.",
        valid=("123e4567-e89b-12d3-a456-426614174000",),
        invalid=(
            "123E4567-E89B-12D3-A456-426614174000",
            "123e4567-e89b-12d3-a456-42661417400",
            "123e4567e89b12d3a456426614174000",
            "123e4567-e89b-12d3-a456-42661417400g",
        ),
    ),
    ConstraintCase(
        "hex_color",
        "regex",
        r"#[0-9a-fA-F]{6}",
        "What is the hex color code of pure red?",
        valid=("#ff0000", "#1A2b3C"),
        invalid=("ff0000", "#ff000", "#ff00000", "#gg0000"),
    ),
    ConstraintCase(
        "time_24h",
        "regex",
        r"([01][0-9]|2[0-3]):[0-5][0-9]",
        "At what time does a bakery usually open? Answer in 24-hour HH:MM.",
        valid=("07:30", "23:59", "00:00"),
        invalid=("24:00", "7:30", "12:60", "07.30", "07:30 am"),
    ),
    ConstraintCase(
        "semver",
        "regex",
        r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})",
        "What version number comes after 1.4.2 in a minor release?",
        valid=("1.5.0", "0.10.3"),
        invalid=("1.5", "01.5.0", "1.5.0-beta", "v1.5.0", "1.5.1000"),
    ),
    ConstraintCase(
        "temperature_celsius",
        "regex",
        r"-?[0-9]{1,2}(\.[0-9])? °C",
        "How cold is Oslo in January? Answer in degrees Celsius, like -3.5 °C.",
        valid=("-3.5 °C", "21 °C"),
        # U+00BA (masculine ordinal) looks like U+00B0 (degree sign)
        invalid=("21 C", "21°C", "21 ºC", "-3.55 °C", "21 °F"),
    ),
    ConstraintCase(
        "menu_line_fr",
        "regex",
        r"(café|thé|croissant|crème brûlée) : [0-9]{1,2},[0-9]{2} €",
        "Write one line of a Paris café menu: an item and its price in euros.",
        valid=("café : 2,50 €", "crème brûlée : 7,00 €"),
        invalid=("cafe : 2,50 €", "café : 2.50 €", "café : 2,50 EUR", "creme brulee : 7,00 €"),
    ),
)


# ---------------------------------------------------------------------------- choices

CHOICE_CASES: tuple[ConstraintCase, ...] = (
    ConstraintCase(
        "sentiment",
        "choices",
        ["positive", "negative", "neutral"],
        "Is the sentiment of 'I love this phone, the battery lasts forever!' positive, "
        "negative or neutral?",
        valid=("positive", "neutral"),
        invalid=("Positive", "positive.", "mixed", ""),
    ),
    ConstraintCase(
        "yes_or_yesterday",
        "choices",
        ["yes", "yesterday", "no", "not yet"],  # "yes" < "yesterday", "no" < "not yet"
        "Has the package arrived? Reply with one of: yes, yesterday, no, not yet.",
        valid=("yes", "yesterday", "not yet"),
        invalid=("ye", "yes ", "Yes", "yesterday!", "not", "no yet"),
    ),
    ConstraintCase(
        "shirt_size",
        "choices",
        ["S", "M", "L", "XL", "XXL"],
        "Which shirt size fits a tall, broad-shouldered man? Answer S, M, L, XL or XXL.",
        valid=("XL", "XXL"),
        invalid=("X", "3XL", "xl", "Large"),
    ),
)


# ---------------------------------------------------------------------------- EBNF

ARITHMETIC_GRAMMAR = r"""root ::= expr
expr ::= term (ws ("+" | "-") ws term)*
term ::= factor (ws ("*" | "/") ws factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]{1,6}
ws ::= " "?
"""

_NUMBER = re.compile(r"[0-9]{1,6}")
_ADD_OP = re.compile(r" ?[+-] ?")
_MUL_OP = re.compile(r" ?[*/] ?")


def _is_arithmetic(text: str) -> bool:
    """Recursive descent over ARITHMETIC_GRAMMAR, without backtracking: when an operand
    after an operator fails, the text left over is one no rule can consume either."""
    return _parse_expr(text, 0) == len(text)


def _parse_expr(text: str, pos: int | None) -> int | None:
    """End of the longest ``expr`` starting at ``pos``, or None."""
    return _parse_chain(text, pos, _ADD_OP, _parse_term)


def _parse_term(text: str, pos: int | None) -> int | None:
    return _parse_chain(text, pos, _MUL_OP, _parse_factor)


def _parse_chain(text: str, pos: int | None, op: re.Pattern[str], operand: Callable) -> int | None:
    pos = operand(text, pos)
    while pos is not None and (m := op.match(text, pos)):
        pos = operand(text, m.end())
    return pos


def _parse_factor(text: str, pos: int | None) -> int | None:
    if pos is None:
        return None
    if text.startswith("(", pos):
        end = _parse_expr(text, pos + 1)
        return end + 1 if end is not None and text.startswith(")", end) else None
    m = _NUMBER.match(text, pos)
    return m.end() if m else None


CONFIG_GRAMMAR = r"""root ::= line{1,6}
line ::= key "=" value "\n"
key ::= [a-z] [a-z_]{0,15}
value ::= [0-9]{1,5} | "true" | "false" | "\"" [a-zA-Z0-9 ./_-]{0,30} "\""
"""
_CONFIG = re.compile(r'([a-z][a-z_]{0,15}=([0-9]{1,5}|true|false|"[a-zA-Z0-9 ./_-]{0,30}")\n){1,6}')

EBNF_CASES: tuple[ConstraintCase, ...] = (
    ConstraintCase(
        "arithmetic_expr",
        "ebnf",
        ARITHMETIC_GRAMMAR,
        "Write an arithmetic expression for the cost of 3 apples at 2 dollars each "
        "plus 4 pears at 3 dollars each.",
        valid=("3 * 2 + 4 * 3", "(1+2)*3", "42", "10 / (4 - 2)"),
        invalid=("3 * 2 +", "(1+2", "1 ++ 2", "1  + 2", "x + 1", "3 * 2 = 6", "1234567", ""),
        recognizer=_is_arithmetic,
    ),
    ConstraintCase(
        "key_value_config",
        "ebnf",
        CONFIG_GRAMMAR,
        "Write a config file for a web server with port, host and debug settings, "
        "one key=value per line.",
        valid=('port=8080\nhost="localhost"\ndebug=false\n', "workers=4\n"),
        invalid=(
            "port = 8080\n",
            "port=8080",
            "Port=8080\n",
            "debug=False\n",
            "host=localhost\n",
            "a=1\n" * 7,
        ),
        recognizer=lambda text: _CONFIG.fullmatch(text) is not None,
    ),
)


# ---------------------------------------------------------------------------- JSON schemas


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A closed object schema; every property is required unless ``required`` says."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


def _str(min_length: int = 1, max_length: int = 40) -> dict[str, Any]:
    return {"type": "string", "minLength": min_length, "maxLength": max_length}


def _int(minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def _json(value: Any) -> str:
    """The compact text the runtime generates: no spaces, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _jsons(*values: Any) -> tuple[str, ...]:
    return tuple(_json(v) for v in values)


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``base`` with keys replaced (a value of ``...`` removes the key); order kept."""
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not ...}


# Feb 29 is left out: a leap-year rule is arithmetic a regex cannot do cheaply.
DATE_PATTERN = (
    "^(19|20)[0-9]{2}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
    "|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)$"
)

_USER = {
    "name": "Alice Martin",
    "age": 34,
    "email": "alice.martin@example.com",
    "city": "Lyon",
    "is_member": True,
    "tags": ["books", "hiking"],
}
_ADDRESS = {"street": "12 Oak Street", "city": "Springfield", "zip": "62704"}
_PLACE = {"place": "Paris", "latitude": 48.8566, "longitude": 2.3522}
_PRODUCT = {"name": "Desk lamp", "price": 24.99, "discount": 0.15}
_MOVIE = {"title": "Alien", "stars": 5, "year": 1979, "runtime_minutes": 117}
_FLAGS = {"dark_mode": True, "notifications": False, "beta_features": False}
_PERSON = {"first_name": "Wolfgang", "middle_name": "Amadeus", "last_name": "Mozart"}
_SEGMENT = {"start": {"x": 0, "y": 0}, "end": {"x": 3, "y": 4}}
_POSTCARD = {"city": "東京", "mood": "😀", "signature": "Amélie"}
_ACCOUNT = {"id": "123e4567-e89b-12d3-a456-426614174000", "email": "help@example.com"}

JSON_CASES: tuple[ConstraintCase, ...] = (
    ConstraintCase(
        "api_user",
        "json_schema",
        _obj(
            {
                "name": _str(),
                "age": _int(0, 120),
                "email": {"type": "string", "pattern": f"^{EMAIL}$"},
                "city": _str(),
                "is_member": {"type": "boolean"},
                "tags": {"type": "array", "items": _str(max_length=20), "maxItems": 5},
            }
        ),
        "Give me the details of a fictional user as JSON.",
        valid=_jsons(_USER, _with(_USER, tags=[])),
        invalid=_jsons(
            _with(_USER, email=...),
            _with(_USER, age=-1),
            _with(_USER, age=130),
            _with(_USER, email="alice.martin.example.com"),
            _with(_USER, is_member="yes"),
            _with(_USER, tags=["a", "b", "c", "d", "e", "f"]),
            {**_USER, "phone": "555-0187"},
        ),
    ),
    ConstraintCase(
        "order_status",
        "json_schema",
        _obj(
            {
                "order_id": {"type": "integer", "minimum": 1},
                "status": {
                    "type": "string",
                    "enum": ["pending", "shipped", "delivered", "cancelled"],
                },
            }
        ),
        "What is the status of order 1042? Reply as JSON.",
        valid=_jsons({"order_id": 1042, "status": "shipped"}),
        invalid=_jsons(
            {"order_id": 1042, "status": "sent"},
            {"order_id": 1042, "status": "Shipped"},
            {"order_id": 0, "status": "pending"},
        ),
    ),
    ConstraintCase(
        "person_address",
        "json_schema",
        _obj(
            {
                "name": _str(),
                "address": _obj(
                    {
                        "street": _str(),
                        "city": _str(max_length=30),
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    }
                ),
            }
        ),
        "Give the name and mailing address of a fictional US customer as JSON.",
        valid=_jsons({"name": "Homer Simpson", "address": _ADDRESS}),
        invalid=_jsons(
            {"name": "Homer Simpson", "address": _with(_ADDRESS, zip="6270")},
            {"name": "Homer Simpson", "address": _with(_ADDRESS, city=...)},
            {"name": "Homer Simpson", "address": {**_ADDRESS, "country": "US"}},
            {"name": "Homer Simpson"},
        ),
    ),
    ConstraintCase(
        "favorite_colors",
        "json_schema",
        _obj(
            {
                "colors": {
                    "type": "array",
                    "items": _str(max_length=12),
                    "minItems": 2,
                    "maxItems": 3,
                }
            }
        ),
        "List two or three of your favorite colors as JSON.",
        valid=_jsons({"colors": ["red", "blue"]}, {"colors": ["red", "blue", "green"]}),
        invalid=_jsons(
            {"colors": ["red"]},
            {"colors": ["red", "blue", "green", "pink"]},
            {"colors": ["red", 3]},
            {"colors": ["red", ""]},
        ),
    ),
    ConstraintCase(
        "shopping_list",
        "json_schema",
        {
            "type": "array",
            "items": _obj({"item": _str(max_length=20), "quantity": _int(1, 99)}),
            "minItems": 1,
            "maxItems": 4,
        },
        "Write a short shopping list for pancakes as a JSON array.",
        valid=_jsons([{"item": "eggs", "quantity": 2}, {"item": "milk", "quantity": 1}]),
        invalid=_jsons(
            [],
            [{"item": "eggs", "quantity": 2}] * 5,
            [{"item": "eggs", "quantity": 0}],
            [{"item": "eggs"}],
        ),
    ),
    ConstraintCase(
        "movie_review",
        "json_schema",
        _obj(
            {
                "title": _str(),
                "stars": _int(1, 5),
                "year": _int(1888, 2030),
                "runtime_minutes": {"type": "integer", "exclusiveMinimum": 0, "maximum": 600},
            }
        ),
        "Rate a classic science-fiction movie from 1 to 5 stars, as JSON.",
        valid=_jsons(_MOVIE, _with(_MOVIE, stars=1, runtime_minutes=600)),
        invalid=_jsons(
            _with(_MOVIE, stars=6),
            _with(_MOVIE, stars=0),
            _with(_MOVIE, stars=4.5),
            _with(_MOVIE, year=1887),
            _with(_MOVIE, runtime_minutes=0),
            _with(_MOVIE, runtime_minutes=601),
        ),
    ),
    ConstraintCase(
        "geo_point",
        "json_schema",
        _obj(
            {
                "place": _str(),
                "latitude": {"type": "number", "minimum": -90, "maximum": 90},
                "longitude": {"type": "number", "minimum": -180, "maximum": 180},
            }
        ),
        "Give the coordinates of a famous city as JSON.",
        valid=_jsons(_PLACE, {"place": "South Pole", "latitude": -90, "longitude": 0}),
        invalid=_jsons(
            _with(_PLACE, latitude=91.5),
            _with(_PLACE, longitude=-180.5),
            _with(_PLACE, latitude="48.8566"),
        ),
    ),
    ConstraintCase(
        "product_price",
        "json_schema",
        _obj(
            {
                "name": _str(max_length=30),
                "price": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10000},
                "discount": {"type": "number", "minimum": 0, "maximum": 1},
            }
        ),
        "Describe a product on sale, with its price in dollars and discount rate, as JSON.",
        valid=_jsons(_PRODUCT, _with(_PRODUCT, price=9999.99, discount=0)),
        invalid=_jsons(
            _with(_PRODUCT, price=0),
            _with(_PRODUCT, price=-5),
            _with(_PRODUCT, price=10000),
            _with(_PRODUCT, discount=1.5),
        ),
    ),
    ConstraintCase(
        "feature_flags",
        "json_schema",
        _obj({name: {"type": "boolean"} for name in _FLAGS}),
        "Which settings are on for a user who likes dark screens but hates notifications? "
        "Answer as JSON with true or false values.",
        valid=_jsons(_FLAGS),
        invalid=_jsons(
            _with(_FLAGS, dark_mode="true"),
            _with(_FLAGS, dark_mode=1),
            _with(_FLAGS, beta_features=None),
            _with(_FLAGS, beta_features=...),
        ),
    ),
    ConstraintCase(
        "person_name",
        "json_schema",
        _obj(
            {
                "first_name": _str(max_length=20),
                "middle_name": {"anyOf": [_str(max_length=20), {"type": "null"}]},
                "last_name": _str(max_length=20),
            }
        ),
        "Give the full name of a famous composer as JSON; use null if there is no middle name.",
        valid=_jsons(_PERSON, _with(_PERSON, middle_name=None)),
        invalid=_jsons(
            _with(_PERSON, middle_name=...),
            _with(_PERSON, middle_name=""),
            _with(_PERSON, middle_name=0),
        ),
    ),
    ConstraintCase(
        "contact_method",
        "json_schema",
        _obj(
            {
                "name": _str(),
                "contact": {
                    "anyOf": [
                        _obj({"phone": {"type": "string", "pattern": f"^{US_PHONE}$"}}),
                        _obj({"email": {"type": "string", "pattern": f"^{EMAIL}$"}}),
                    ]
                },
            }
        ),
        "How can patients reach Dr. Lee? Give one phone number or email, as JSON.",
        valid=_jsons(
            {"name": "Dr. Lee", "contact": {"phone": "(212) 555-0187"}},
            {"name": "Dr. Lee", "contact": {"email": "lee@clinic.org"}},
        ),
        invalid=_jsons(
            {"name": "Dr. Lee", "contact": {}},
            {"name": "Dr. Lee", "contact": {"phone": "(212) 555-0187", "email": "lee@clinic.org"}},
            {"name": "Dr. Lee", "contact": {"phone": "212-555-0187"}},
        ),
    ),
    ConstraintCase(
        "book",
        "json_schema",
        _obj(
            {
                "title": _str(),
                "author": _str(),
                "subtitle": _str(),
                "year": _int(1450, 2030),
            },
            required=["title", "author"],
        ),
        "Describe a famous science-fiction book as JSON.",
        valid=_jsons(
            {"title": "Dune", "author": "Frank Herbert"},
            {"title": "Dune", "author": "Frank Herbert", "year": 1965},
            {"title": "Foundation", "author": "Isaac Asimov", "subtitle": "Book one", "year": 1951},
        ),
        invalid=_jsons(
            {"title": "Dune"},
            {"title": "Dune", "author": "Frank Herbert", "isbn": "0441013597"},
            {"title": "Dune", "author": "Frank Herbert", "year": "1965"},
        ),
    ),
    ConstraintCase(
        "user_profile",
        "json_schema",
        # the length lives in the pattern: xgrammar ignores minLength/maxLength beside one
        _obj({"username": {"type": "string", "pattern": "^[a-z0-9_]{3,16}$"}, "bio": _str(0, 40)}),
        "Create a profile for a cartoonist on a social network, as JSON.",
        valid=_jsons(
            {"username": "pixel_fox", "bio": "Draws cats and drinks tea."},
            {"username": "abc", "bio": ""},
        ),
        invalid=_jsons(
            {"username": "ab", "bio": ""},
            {"username": "pixel_fox_the_great", "bio": ""},
            {"username": "Pixel!", "bio": ""},
            {"username": "pixel_fox", "bio": "x" * 41},
        ),
    ),
    ConstraintCase(
        "line_segment",
        "json_schema",
        {
            "$defs": {"point": _obj({"x": _int(-1000, 1000), "y": _int(-1000, 1000)})},
            **_obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}),
        },
        "Give the start and end points of a line segment on a grid as JSON.",
        valid=_jsons(_SEGMENT, {"start": {"x": -5, "y": 1000}, "end": {"x": 0, "y": 0}}),
        invalid=_jsons(
            _with(_SEGMENT, end={"x": 3}),
            _with(_SEGMENT, end={"x": 1.5, "y": 4}),
            _with(_SEGMENT, end={"x": 3, "y": 4, "z": 0}),
            _with(_SEGMENT, end={"x": 1001, "y": 4}),
        ),
    ),
    ConstraintCase(
        "postcard",
        "json_schema",
        _obj(
            {
                "city": {"type": "string", "enum": ["東京", "Zürich", "São Paulo", "Kraków"]},
                "mood": {"type": "string", "enum": ["😀", "😐", "😢"]},
                "signature": {"type": "string", "const": "Amélie"},
            }
        ),
        "Fill in a postcard as JSON: pick a city and a mood emoji, signed by Amélie.",
        valid=_jsons(_POSTCARD, _with(_POSTCARD, city="Zürich", mood="😢")),
        invalid=_jsons(
            _with(_POSTCARD, city="Tokyo"),
            _with(_POSTCARD, city="Zurich"),
            _with(_POSTCARD, mood=":)"),
            _with(_POSTCARD, signature="Amelie"),
        ),
    ),
    ConstraintCase(
        "product_sku",
        "json_schema",
        _obj(
            {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "name": _str(max_length=30),
            }
        ),
        "Invent a product for a hardware store with a SKU like ABC-1234, as JSON.",
        valid=_jsons({"sku": "HMR-0042", "name": "Claw hammer"}),
        invalid=_jsons(
            {"sku": "hmr-0042", "name": "Claw hammer"},
            {"sku": "HMR0042", "name": "Claw hammer"},
            {"sku": "HMR-00420", "name": "Claw hammer"},
        ),
    ),
    ConstraintCase(
        "event_date",
        "json_schema",
        _obj({"event": _str(), "date": {"type": "string", "pattern": DATE_PATTERN}}),
        "When did the first person walk on the Moon? Answer as JSON with an ISO date.",
        valid=_jsons(
            {"event": "Moon landing", "date": "1969-07-20"},
            {"event": "New Year's Eve", "date": "1999-12-31"},
        ),
        invalid=_jsons(
            {"event": "Moon landing", "date": "1969-02-30"},
            {"event": "Moon landing", "date": "1969-04-31"},
            {"event": "Moon landing", "date": "1969-13-20"},
            {"event": "Moon landing", "date": "19690720"},
        ),
    ),
    ConstraintCase(
        "account_formats",
        "json_schema",
        _obj(
            {
                "id": {"type": "string", "format": "uuid"},
                "email": {"type": "string", "format": "email"},
            }
        ),
        "Create a support account with an id (a UUID) and a contact email, as JSON.",
        valid=_jsons(_ACCOUNT),
        invalid=_jsons(
            _with(_ACCOUNT, id="123e4567-e89b-12d3-a456-42661417400"),
            _with(_ACCOUNT, id="123e4567e89b12d3a456426614174000"),
            _with(_ACCOUNT, email="help.example.com"),
        ),
    ),
)

CASES: tuple[ConstraintCase, ...] = REGEX_CASES + CHOICE_CASES + EBNF_CASES + JSON_CASES
_BY_NAME = {case.name: case for case in CASES}


def find_case(name: str) -> ConstraintCase:
    """The case called ``name``.

    Raises:
        KeyError: no such case (the message lists the names there are).
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no constraint case {name!r}; there are {sorted(_BY_NAME)}") from None
