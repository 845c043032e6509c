"""Regular expressions for the JSON Schema formats llguidance does not know itself, so
that ``schema_check`` can enforce them as a ``pattern`` (which llguidance does).

Each accepts exactly the format's strings, as its RFC's ABNF defines them; each is
built from named pieces that follow the ABNF's rules one by one, so that a reader can
check them against it. Each is anchored (``^...$``) and uses only what every regex
dialect involved reads alike (llguidance's Rust regex, Python's ``re``, ECMA 262):
classes, groups, alternation, counted repetition; no lookaround, no class escapes.
Python callers must use ``fullmatch``: under ``re.match`` or ``re.search`` a ``$``
also matches before a final newline (Rust's ``$`` does not), so ``"a\\n"`` would pass.

    uri-reference          RFC 3986, section 4.1 (appendix A's ABNF)
    json-pointer           RFC 6901, section 3
    relative-json-pointer  draft-handrews-relative-json-pointer-01, section 3

One takes a subset, so what is generated passes while not every valid string can be:

    regex                  literal characters, escaped metacharacters, the class
                           escapes ``\\d`` ``\\w`` ``\\s`` (and upper-case), ``.``, a leading ``^``
                           and a closing ``$``: a regular expression in every dialect,
                           never one with groups, classes or quantifiers

``STRICTER_FORMATS``: formats llguidance knows but reads more loosely than the
validators users check outputs with (Python's ``date.fromisoformat`` and
rfc3339-validator, jsonschema's checkers): it takes year 0000, February 29th of any
year and a leap second (``23:59:60``), which RFC 3339's ABNF allows and those refuse.
Each pattern here takes a subset of the RFC's strings that every such checker takes:

    date        RFC 3339 full-date, years 0001-9999, February 29th in leap years only
    date-time   RFC 3339 date-time over that date, seconds 00-59, ``T`` / ``t`` between
    time        RFC 3339 full-time, seconds 00-59

``FORMAT_SUBSETS``: formats enforced as another whose strings they all include (every
URI is an IRI; an ASCII address is an internationalized one).
"""

from __future__ import annotations

__all__ = ["FORMAT_PATTERNS", "FORMAT_SUBSETS", "STRICTER_FORMATS"]

# RFC 3986 appendix A, rule by rule (class contents unbracketed where they combine).
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT_ENCODED = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT_ENCODED})"
_SEGMENT = rf"{_PCHAR}*"
_SEGMENT_NZ = rf"{_PCHAR}+"
_SEGMENT_NZ_NC = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}@]|{_PCT_ENCODED})+"  # no colon
_QUERY = rf"(?:{_PCHAR}|[/?])*"
_FRAGMENT = _QUERY
_SCHEME = r"[A-Za-z][A-Za-z0-9+\-.]*"
_USERINFO = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT_ENCODED})*"
_DEC_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]|[0-9])"
_IPV4_ADDRESS = rf"{_DEC_OCTET}\.{_DEC_OCTET}\.{_DEC_OCTET}\.{_DEC_OCTET}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4_ADDRESS})"


def _h16s_then_h16(n: int) -> str:
    """``[ *n( h16 ":" ) h16 ]``: up to n + 1 groups before a "::"."""
    return rf"(?:(?:{_H16}:){{0,{n}}}{_H16})?"


_IPV6_ADDRESS = (
    "(?:"
    + "|".join(
        [
            rf"(?:{_H16}:){{6}}{_LS32}",
            rf"::(?:{_H16}:){{5}}{_LS32}",
            rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
            rf"{_h16s_then_h16(1)}::(?:{_H16}:){{3}}{_LS32}",
            rf"{_h16s_then_h16(2)}::(?:{_H16}:){{2}}{_LS32}",
            rf"{_h16s_then_h16(3)}::{_H16}:{_LS32}",
            rf"{_h16s_then_h16(4)}::{_LS32}",
            rf"{_h16s_then_h16(5)}::{_H16}",
            rf"{_h16s_then_h16(6)}::",
        ]
    )
    + ")"
)
# The version flag in lower case only. ABNF's quoted strings are case-insensitive (RFC 5234,
# 2.3), so "V" is the RFC's too, but jsonschema's uri-reference check (rfc3986-validator)
# refuses it: what is generated must pass the check users run, so the stricter reading.
_IPV_FUTURE = rf"v[0-9A-Fa-f]+\.[{_UNRESERVED}{_SUB_DELIMS}:]+"
_IP_LITERAL = rf"\[(?:{_IPV6_ADDRESS}|{_IPV_FUTURE})\]"
# reg-name takes every IPv4address too, so host needs no alternative of its own for one
_REG_NAME = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT_ENCODED})*"
_HOST = rf"(?:{_IP_LITERAL}|{_REG_NAME})"
_PORT = r"[0-9]*"
_AUTHORITY = rf"(?:{_USERINFO}@)?{_HOST}(?::{_PORT})?"
_PATH_ABEMPTY = rf"(?:/{_SEGMENT})*"
_PATH_ABSOLUTE = rf"/(?:{_SEGMENT_NZ}(?:/{_SEGMENT})*)?"
_PATH_NOSCHEME = rf"{_SEGMENT_NZ_NC}(?:/{_SEGMENT})*"
_PATH_ROOTLESS = rf"{_SEGMENT_NZ}(?:/{_SEGMENT})*"
_HIER_PART = rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_ROOTLESS}|)"
_RELATIVE_PART = rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_NOSCHEME}|)"
_URI = rf"{_SCHEME}:{_HIER_PART}(?:\?{_QUERY})?(?:#{_FRAGMENT})?"
_RELATIVE_REF = rf"{_RELATIVE_PART}(?:\?{_QUERY})?(?:#{_FRAGMENT})?"
_URI_REFERENCE = rf"(?:{_URI}|{_RELATIVE_REF})"

# RFC 6901: "/"-separated reference tokens, "~" only as "~0" or "~1".
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
# draft-bhutton-relative-json-pointer-00 (2020-12's reference) adds an optional index
# manipulation ("+" or "-", then an integer) after the integer: -01's strings are a subset of
# its, so whatever this pattern lets through is valid under either draft.
_RELATIVE_JSON_POINTER = rf"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})"

# Outside a class every one of these is a metacharacter in each dialect.
_REGEX_META = r"\\^$.|?*+()\[\]{}"
_REGEX_ATOM = rf"(?:[^{_REGEX_META}\x00-\x1f]|\\[{_REGEX_META}/dDwWsS]|\.)"

FORMAT_PATTERNS: dict[str, str] = {
    "uri-reference": f"^{_URI_REFERENCE}$",
    "json-pointer": f"^{_JSON_POINTER}$",
    "relative-json-pointer": f"^{_RELATIVE_JSON_POINTER}$",
    "regex": rf"^\^?{_REGEX_ATOM}*\$?$",
}

# RFC 3339 section 5.6, with year 0000, February 29th of common years and leap
# seconds left out (section 5.7's restrictions, and what Python's checkers take).
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
# divisible by 4 and not by 100 (the last two digits), or by 400 (the first two)
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_FULL_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME_OFFSET = r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_FULL_TIME = rf"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?{_TIME_OFFSET}"

STRICTER_FORMATS: dict[str, str] = {
    "date": f"^{_FULL_DATE}$",
    "date-time": f"^{_FULL_DATE}[Tt]{_FULL_TIME}$",
    "time": f"^{_FULL_TIME}$",
}

FORMAT_SUBSETS: dict[str, str] = {
    "iri": "uri",
    "iri-reference": "uri-reference",
    "idn-email": "email",
}
