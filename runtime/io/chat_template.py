"""Chat templates as role blocks: the text that opens and closes each role's block.

It lives in the runtime's io because two sides read it: the DSL renders programs' role
blocks with it, and the HTTP server sends it to remote DSL clients (``/get_model_info``).

The interpreter turns ``s += sgl.user(...)`` into ``prefix + content + suffix`` appended
to the state's text, so a chat template here is a table of strings per role, not a Jinja
program. The table is derived from the tokenizer's own Jinja chat template, never from the
model's name: the model's files are the single source of truth, and a renamed or fine-tuned
model keeps working.

How the table is read off the template: render conversations whose contents are unique
sentinels and cut the rendered text around them. Appending one message to a conversation
must only append text (the template is *prefix-stable*); then the appended text is that
message's block::

    render([user])            = first_prefix[user]  S0  suffix[user]
    render([user, assistant]) = render([user])  +  prefix[assistant]  S1  suffix[assistant]
                                                   \\______ what one message appends _____/

A template that rewrites earlier text when a message is added cannot be followed by
appending anyway, so such a shape counts as refused. Whitespace is kept exactly as rendered.

``first_prefixes`` holds what opens a role's block when it is the first message: whatever
the template adds before the first message comes with it (a default system block, BOS
text such as ``<|begin_of_text|>``). The assistant prefix is what
``add_generation_prompt=True`` appends, which is what the model saw in training before a
reply.

BOS: when the rendered text starts with the tokenizer's BOS token, that text stays in
``first_prefixes``. The DSL's Runtime backend therefore tokenizes a state's text that
starts with the BOS text with ``add_special_tokens=False``, so a tokenizer that adds BOS
itself does not double it (and adds it to text that has none, such as a program that
uses no role blocks).

A role the template refuses (one raising on system messages, or requiring alternation) is
not an error at construction: ``prefix_and_suffix`` raises a ``ValueError`` naming the role
and the template's own error only when a program uses that role there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["ROLES", "ChatTemplate", "FALLBACK", "chat_template_from_tokenizer"]

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    """Text around each role's content, as the model's chat format renders it.

    Invariant: every role with a prefix (first or later) has a suffix. A role missing from
    ``first_prefixes`` or ``role_prefixes`` cannot be rendered at that position; the reason
    is in ``unavailable``.

    Attributes:
        name: ``"model"`` when derived from the tokenizer's template, else the fallback's name.
        role_prefixes: role -> text opening its block after at least one earlier message.
        role_suffixes: role -> text closing its block.
        first_prefixes: role -> text opening its block as the conversation's first message,
            including whatever the template puts before it (BOS text, a default system block).
        stop_token_ids: end-of-turn special tokens an assistant ``gen`` must stop at.
        image_token: the text standing for an image in the content, if the model has one.
        unavailable: role -> why the template cannot render it at a missing position.
    """

    name: str
    role_prefixes: Mapping[str, str]
    role_suffixes: Mapping[str, str]
    first_prefixes: Mapping[str, str]
    stop_token_ids: tuple[int, ...]
    image_token: str | None = None
    unavailable: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Read-only views: a template is shared by every program run on a backend.
        for name in ("role_prefixes", "role_suffixes", "first_prefixes", "unavailable"):
            table = dict(getattr(self, name))
            unknown = sorted(set(table) - set(ROLES))
            if unknown:
                raise ValueError(f"{name}: unknown roles {unknown}; expected roles in {ROLES}")
            object.__setattr__(self, name, MappingProxyType(table))
        opened = set(self.role_prefixes) | set(self.first_prefixes)
        unclosed = sorted(opened - set(self.role_suffixes))
        if unclosed:
            raise ValueError(f"roles {unclosed} have a prefix but no entry in role_suffixes")
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (what a server sends its DSL clients); ``from_dict`` reads it back."""
        return {
            "name": self.name,
            "role_prefixes": dict(self.role_prefixes),
            "role_suffixes": dict(self.role_suffixes),
            "first_prefixes": dict(self.first_prefixes),
            "stop_token_ids": list(self.stop_token_ids),
            "image_token": self.image_token,
            "unavailable": dict(self.unavailable),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatTemplate:
        """Raises ValueError (or TypeError) when ``data`` is not a ``to_dict`` result."""
        return cls(**data)

    def prefix_and_suffix(self, role: str, num_previous_messages: int) -> tuple[str, str]:
        """The text before and after a ``role`` message's content.

        Args:
            role: ``"system"``, ``"user"`` or ``"assistant"``.
            num_previous_messages: how many messages the conversation already holds; 0 picks
                the first-message prefix.

        Returns:
            ``(prefix, suffix)``.

        Raises:
            ValueError: for an unknown role, a negative count, or a role the model's
                template refuses at this position (the message names the role and the
                template's error).
        """
        if role not in ROLES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {ROLES}")
        if num_previous_messages < 0:
            raise ValueError(f"num_previous_messages must be >= 0, got {num_previous_messages}")
        prefixes = self.first_prefixes if num_previous_messages == 0 else self.role_prefixes
        if role not in prefixes:
            where = "as the first message" if num_previous_messages == 0 else "after a message"
            reason = self.unavailable.get(role, "no rendering known")
            raise ValueError(
                f"chat template {self.name!r} cannot render a {role!r} message {where}: {reason}"
            )
        return prefixes[role], self.role_suffixes[role]


def _plain_prefixes() -> dict[str, str]:
    return {role: f"{role.capitalize()}: " for role in ROLES}


# Models without a chat template (base models) get a readable transcript format; no special
# token ends a turn, so an assistant gen stops only at EOS or the program's own stop.
FALLBACK = ChatTemplate(
    name="plain",
    role_prefixes=_plain_prefixes(),
    role_suffixes={role: "\n" for role in ROLES},
    first_prefixes=_plain_prefixes(),
    stop_token_ids=(),
)


# Conversation shapes (roles in order) whose LAST message is the one cut out. Several per
# role because templates refuse different orders; the most common shape comes first.
_FIRST_SHAPES: Mapping[str, tuple[tuple[str, ...], ...]] = {role: ((role,),) for role in ROLES}
_LATER_SHAPES: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "system": (("user", "system"), ("user", "assistant", "system")),
    "user": (("system", "user"), ("user", "assistant", "user"), ("assistant", "user")),
    "assistant": (("user", "assistant"), ("system", "user", "assistant")),
}
# Conversations ending with a user message, to read the generation prompt off.
_PROMPT_SHAPES = (("user",), ("system", "user"), ("user", "assistant", "user"))


@dataclass(frozen=True)
class _Cut:
    """One role's block at one position, or why no shape rendered it."""

    prefix_and_suffix: tuple[str, str] | None
    errors: tuple[str, ...]


def _sentinel(index: int) -> str:
    # Letters, digits and underscores only: survives `| trim`, and no template contains it.
    return f"RADIXLM_SENTINEL_{index}_Q7X"


def _render(tokenizer: Any, roles: tuple[str, ...], add_generation_prompt: bool = False) -> str:
    messages = [{"role": role, "content": _sentinel(i)} for i, role in enumerate(roles)]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


def _cut_last(tokenizer: Any, roles: tuple[str, ...]) -> tuple[str, str]:
    """The prefix and suffix of the last message of ``roles``: what appending it appends.

    Raises:
        ValueError: the template is not prefix-stable here, or drops or repeats the content.
    """
    full = _render(tokenizer, roles)
    before = _render(tokenizer, roles[:-1]) if len(roles) > 1 else ""
    if not full.startswith(before):
        raise ValueError("adding the message rewrote earlier text (not prefix-stable)")
    pieces = full[len(before) :].split(_sentinel(len(roles) - 1))
    if len(pieces) != 2:
        raise ValueError(f"the message's content appears {len(pieces) - 1} times, expected once")
    return pieces[0], pieces[1]


def _first_accepted(tokenizer: Any, shapes: tuple[tuple[str, ...], ...]) -> _Cut:
    errors = []
    for roles in shapes:
        try:
            return _Cut(_cut_last(tokenizer, roles), tuple(errors))
        # The template is arbitrary Jinja that may raise anything; the error is kept and
        # raised by prefix_and_suffix if a program uses this role here.
        except Exception as exc:
            errors.append(f"[{', '.join(roles)}] -> {type(exc).__name__}: {exc}")
    return _Cut(None, tuple(errors))


def _generation_prompt(tokenizer: Any) -> str:
    """What ``add_generation_prompt=True`` appends after a user message ("" if nothing)."""
    for roles in _PROMPT_SHAPES:
        try:
            without, with_prompt = _render(tokenizer, roles), _render(tokenizer, roles, True)
        except Exception:  # a refused shape: the next one may render
            continue
        if with_prompt.startswith(without):
            return with_prompt[len(without) :]
    return ""


def _special_ids(tokenizer: Any) -> set[int]:
    # all_special_ids misses added specials such as Llama 3's <|eot_id|>. The unknown token
    # stands for text the vocabulary lacks, never for an end of turn.
    added = getattr(tokenizer, "added_tokens_decoder", {})
    special = set(tokenizer.all_special_ids) | {i for i, tok in added.items() if tok.special}
    return special - {getattr(tokenizer, "unk_token_id", None)}


def _stop_token_ids(tokenizer: Any, assistant_suffix: str) -> tuple[int, ...]:
    """The special tokens in the assistant suffix, in order: a reply ends at any of them."""
    special = _special_ids(tokenizer)
    ids = tokenizer.encode(assistant_suffix, add_special_tokens=False)
    return tuple(dict.fromkeys(i for i in ids if i in special))


def _unavailable_reason(first: _Cut, later: _Cut) -> str | None:
    reasons = []
    if first.prefix_and_suffix is None:
        reasons.append("as the first message: " + "; ".join(first.errors))
    if later.prefix_and_suffix is None:
        reasons.append("after a message: " + "; ".join(later.errors))
    return " | ".join(reasons) or None


def adds_special_tokens(text: str, bos_token: str | None) -> bool:
    """Whether to tokenize a program's ``text`` with the tokenizer's special tokens:
    not when it starts with the BOS text already (from ``first_prefixes``), so that
    a tokenizer adding BOS itself does not double it (see the module docstring)."""
    return not (bos_token and text.startswith(bos_token))


def chat_template_from_tokenizer(tokenizer: Any) -> ChatTemplate:
    """Reads a ChatTemplate off the tokenizer's own chat template.

    Args:
        tokenizer: a ``transformers`` tokenizer (uses ``chat_template``,
            ``apply_chat_template``, ``encode``, ``all_special_ids``,
            ``added_tokens_decoder``).

    Returns:
        The derived template (name ``"model"``), or ``FALLBACK`` when the tokenizer has no
        chat template. Roles the template refuses are recorded, not raised (see module doc).
    """
    if not getattr(tokenizer, "chat_template", None):
        return FALLBACK
    first_prefixes, prefixes, suffixes, unavailable = {}, {}, {}, {}
    for role in ROLES:
        first = _first_accepted(tokenizer, _FIRST_SHAPES[role])
        later = _first_accepted(tokenizer, _LATER_SHAPES[role])
        if first.prefix_and_suffix is not None:
            first_prefixes[role], suffixes[role] = first.prefix_and_suffix
        if later.prefix_and_suffix is not None:
            prefixes[role], suffixes[role] = later.prefix_and_suffix
        reason = _unavailable_reason(first, later)
        if reason is not None:
            unavailable[role] = reason
    generation_prompt = _generation_prompt(tokenizer)
    # A template that ignores add_generation_prompt keeps the header its history renders.
    if generation_prompt and "assistant" in prefixes:
        prefixes["assistant"] = generation_prompt
    image_token = getattr(tokenizer, "image_token", None)
    return ChatTemplate(
        name="model",
        role_prefixes=prefixes,
        role_suffixes=suffixes,
        first_prefixes=first_prefixes,
        stop_token_ids=_stop_token_ids(tokenizer, suffixes.get("assistant", "")),
        image_token=image_token if isinstance(image_token, str) else None,
        unavailable=unavailable,
    )
