"""radixlm run / generate's sampling flags are the table's ``cli`` fields, checked as the
engine checks them while the command line is parsed (no model: the engine is faked where
one is run)."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from radixlm.runtime.entrypoints import cli
from radixlm.runtime.entrypoints.cli_sampling import (
    GENERATE_DEFAULTS,
    RUN_DEFAULTS,
    add_sampling_flags,
    sampling_params,
)
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io import sampling_fields
from radixlm.runtime.io.sampling_fields import SAMPLING_FIELDS, Bound, _field, fields_on
from radixlm.runtime.io.sampling_params import SamplingParams

# A field the table does not have, as one would add it (the builder _field, cli=True).
TYPICAL_P = _field("typical_p", "float", 1.0, Bound(0, 1, low_open=True), cli=True)


def _parser(defaults: dict[str, Any] | None = None, fields: Any = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_sampling_flags(parser, defaults or {}, fields)
    return parser


def _accepts(parser: argparse.ArgumentParser, flag: str, text: str) -> bool:
    try:
        parser.parse_args([flag, text])
    except argparse.ArgumentError:
        return False
    return True


def test_the_flags_are_the_tables_cli_fields_in_its_order():
    flags = [
        a.option_strings[0] for a in _parser()._actions if a.option_strings != ["-h", "--help"]
    ]
    assert flags == ["--" + spec.name.replace("_", "-") for spec in fields_on("cli")]
    assert {spec.kind for spec in fields_on("cli")} <= {"int", "float", "bool"}


def _edge_texts(bound: Bound, kind: str) -> list[str]:
    """Each end of ``bound`` and its neighbours, as a person would type them."""
    texts = []
    for end in (bound.low, bound.high, *bound.also):
        if end is None:
            continue
        if kind == "int":
            texts += [str(int(end) + d) for d in (-1, 0, 1)]
        else:
            texts += [repr(math.nextafter(end, d)) for d in (-math.inf, math.inf)] + [repr(end)]
    return texts


@pytest.mark.parametrize("spec", [s for s in fields_on("cli") if s.bound], ids=lambda s: s.name)
def test_a_flag_accepts_what_the_engine_accepts(spec: sampling_fields.SamplingField):
    parser = _parser()
    flag = spec.names_on("cli")[0]
    for text in [*_edge_texts(spec.bound, spec.kind), "inf", "nan", "x", "1.5"]:
        try:
            SamplingParams(**{spec.name: (int if spec.kind == "int" else float)(text)})
            on_engine = True
        except (ValueError, InvalidRequestError):  # not a number of its kind, or out of bounds
            on_engine = False
        assert _accepts(parser, flag, text) == on_engine, (flag, text)


def test_each_subcommand_keeps_its_defaults():
    parser = cli._build_parser()
    assert sampling_params(parser.parse_args(["run"])) == RUN_DEFAULTS
    assert sampling_params(parser.parse_args(["generate", "hi"])) == GENERATE_DEFAULTS
    assert RUN_DEFAULTS == {"max_new_tokens": 512, "temperature": 0.7, "top_p": 0.9}
    assert GENERATE_DEFAULTS == {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0}


def test_only_the_flags_given_or_defaulted_are_sent():
    args = cli._build_parser().parse_args(
        ["generate", "hi", "--top-k", "5", "--seed", "7", "--ignore-eos", "--temperature", "0.5"]
    )
    params = sampling_params(args)
    assert params == {
        **GENERATE_DEFAULTS,
        "temperature": 0.5,
        "top_k": 5,
        "seed": 7,
        "ignore_eos": True,
    }
    sampling = SamplingParams.from_dict(params)
    assert (sampling.top_k, sampling.seed, sampling.ignore_eos) == (5, 7, True)


def test_top_k_0_exits_2_naming_the_flag_and_its_bound(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["generate", "hi", "--top-k", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --top-k: expected -1 (off) or >= 1, got 0" in err


class _RecordingEngine:
    """Engine's face for ``radixlm generate``: records the sampling dict, streams one chunk."""

    sent: list[SamplingParams] = []

    def __init__(self, **options: Any) -> None:
        self.tokenizer = argparse.Namespace(chat_template=None)

    def __enter__(self) -> _RecordingEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def generate(self, prompt: str, params: dict[str, Any], stream: bool) -> Any:
        self.sent.append(SamplingParams.from_dict(params))
        yield {"delta": "ok"}


def test_top_k_reaches_the_engines_sampling_params(monkeypatch, capsys):
    monkeypatch.setattr(cli, "Engine", _RecordingEngine)
    _RecordingEngine.sent.clear()
    assert cli.main(["generate", "hi", "--top-k", "5", "--max-new-tokens", "3"]) == 0
    (sent,) = _RecordingEngine.sent
    assert (sent.top_k, sent.max_new_tokens, sent.temperature) == (5, 3, 0.0)
    assert capsys.readouterr().out == "ok\n"


def test_a_field_added_to_the_table_is_a_flag_of_both_subcommands(monkeypatch):
    monkeypatch.setattr(sampling_fields, "SAMPLING_FIELDS", (*SAMPLING_FIELDS, TYPICAL_P))
    parser = cli._build_parser()
    for argv in (["run"], ["generate", "hi"]):
        assert sampling_params(parser.parse_args([*argv, "--typical-p", "0.5"]))["typical_p"] == 0.5
    built = _parser(fields=[TYPICAL_P])
    assert not _accepts(built, "--typical-p", "0")
    assert sampling_params(built.parse_args([])) == {}


def test_a_default_for_no_flag_is_refused():
    with pytest.raises(ValueError, match="typical_p"):
        _parser({"typical_p": 0.5})
