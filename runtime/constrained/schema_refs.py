"""``$ref`` plumbing for ``schema_check``: two rewrites that keep every reference's meaning
while putting it in the shapes a backend compiles.

1. ``hoist_refs`` (before the read, on the schema as written): a ``$ref`` into anything
   but a definition (``"#/allOf/0/then/properties/env"``, ``"#/properties/a"``) points
   at a node the read may rewrite or move. Its target is copied into the definitions
   (``$defs/radixlm_ref_N``) and the reference points there: the copy is read like any
   definition, and the original stays where it was.

2. ``inline_recursive_refs`` (after the read, llguidance only, and only once it refused
   the schema as read: pure references hide oneOf branches it otherwise tells apart):
   llguidance refuses a
   ``$ref`` with sibling keywords in a schema with a cycle of references ("circular
   references with sibling keys"),
   since it would have to intersect a schema with itself. ``{"$ref": R, ...siblings}``
   on a cycle becomes ``{"$ref": N}`` with a new definition ``N = {"allOf": [body of R,
   siblings]}``: the same values (JSON Schema applies ``$ref`` and its siblings as
   allOf), with R's body copied once so that the cycle through it runs through plain
   references only::

       node = {properties: {kids: {items: {$ref: node, properties: {x: false}}}}}
         -> node   = {properties: {kids: {items: {$ref: node_1}}}}
            node_1 = {allOf: [{properties: {kids: {items: {$ref: node_1}}}},
                              {properties: {x: false}}]}
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

__all__ = ["hoist_refs", "inline_recursive_refs", "resolve_pointer"]

_CONTAINERS = ("$defs", "definitions")
# Keywords with no validation meaning beside a $ref: dropped (they are not siblings).
_ANNOTATIONS = frozenset(
    {"title", "description", "$comment", "examples", "default", "deprecated", "$schema", "$id"}
)
# Keywords whose values are JSON data, not subschemas.
_DATA = frozenset({"enum", "const", "default", "examples"})
_HOISTED = "radixlm_ref_"
_INLINED = "radixlm_inline_"


def hoist_refs(schema: Any) -> Any:
    """``schema`` (not modified) with every local ``$ref`` pointing at a definition
    (``#``, ``#/$defs/NAME`` or ``#/definitions/NAME``); the other targets copied there.
    A reference whose target does not exist is left for the read to refuse."""
    if not isinstance(schema, dict) or not _has_inner_refs(schema):
        return schema
    out = copy.deepcopy(schema)
    container = "definitions" if isinstance(out.get("definitions"), dict) else "$defs"
    defs = out.setdefault(container, {})
    names: dict[str, str] = {}  # pointer -> hoisted definition name
    pending = [out]
    while pending:
        for node in _nodes(pending.pop()):
            ref = node.get("$ref")
            if not isinstance(ref, str) or _points_at_definition(ref):
                continue
            pointer = ref[1:]
            if pointer not in names:
                target = resolve_pointer(schema, pointer)
                if target is None:
                    continue
                names[pointer] = f"{_HOISTED}{len(names)}"
                defs[names[pointer]] = hoisted = copy.deepcopy(target)
                pending.append(hoisted)
            node["$ref"] = f"#/{container}/{names[pointer]}"
    return out


def inline_recursive_refs(schema: Any) -> Any:
    """``schema`` (modified in place and returned), if its references form a cycle, with
    each ``$ref`` that has sibling keywords rewritten as the module docstring draws."""
    if not isinstance(schema, dict):
        return schema
    cyclic = _cyclic_targets(schema)
    if not cyclic:
        return schema
    container = "$defs" if isinstance(schema.get("$defs"), dict) else "definitions"
    inliner = _Inliner(schema, schema.setdefault(container, {}), container, cyclic)
    for node in list(_nodes(schema)):
        _lift_cyclic_member(node, cyclic)
        _distribute(node, cyclic)
    pending = [schema]
    while pending:
        for node in list(_nodes(pending.pop())):
            inliner.fix(node)
        pending.extend(inliner.added)
        inliner.added.clear()
    return schema


class _Inliner:
    def __init__(self, root: dict, defs: dict, container: str, cyclic: set[str]) -> None:
        self.root = root
        self.defs = defs
        self.container = container
        self.cyclic = cyclic
        self.made: dict[str, str] = {}  # (target, siblings) key -> new definition name
        self.fixing: set[int] = set()
        self.added: list[dict] = []  # new definitions, walked in turn

    def fix(self, node: dict) -> None:
        """Makes ``node`` a plain reference if it is a cyclic one with siblings."""
        ref = node.get("$ref")
        if not isinstance(ref, str) or ref[1:] not in self.cyclic:
            return
        for note in _ANNOTATIONS & node.keys():
            del node[note]
        siblings = {k: v for k, v in node.items() if k != "$ref" and k not in _CONTAINERS}
        if not siblings or id(node) in self.fixing:
            return
        self.fixing.add(id(node))
        key = json.dumps([ref, siblings], sort_keys=True)
        if key not in self.made:
            name = f"{_INLINED}{len(self.made)}"
            self.made[key] = name
            body = {k: v for k, v in copy.deepcopy(self.body(ref)).items() if k not in _CONTAINERS}
            self.defs[name] = merged = _merged(body, siblings)
            self.added.append(merged)
        for sibling in siblings:
            del node[sibling]
        node["$ref"] = f"#/{self.container}/{self.made[key]}"
        self.fixing.discard(id(node))

    def body(self, ref: str) -> Any:
        """What ``ref`` finally points at past plain references (each fixed first)."""
        seen: set[str] = set()
        target = resolve_pointer(self.root, ref[1:])
        while isinstance(target, dict) and isinstance(target.get("$ref"), str):
            self.fix(target)
            if set(target) != {"$ref"} or target["$ref"] in seen:
                break
            seen.add(target["$ref"])
            target = resolve_pointer(self.root, target["$ref"][1:])
        return target if target is not None else {}


def _lift_cyclic_member(node: dict, cyclic: set[str]) -> None:
    """An allOf member that is a reference on a cycle becomes the node's own ``$ref``
    (``allOf [R, B]`` is ``R`` beside ``allOf [B]``: both apply), which ``fix`` then
    inlines: llguidance refuses to intersect the reference as a member."""
    members = node.get("allOf")
    if "$ref" in node or not isinstance(members, list):
        return
    for i, member in enumerate(members):
        ref = member.get("$ref") if isinstance(member, dict) else None
        if isinstance(ref, str) and ref[1:] in cyclic and not set(member) - _ANNOTATIONS - {"$ref"}:
            rest = members[:i] + members[i + 1 :]
            node["$ref"] = ref
            if rest:
                node["allOf"] = rest
            else:
                del node["allOf"]
            return


def _distribute(node: dict, cyclic: set[str]) -> None:
    """An anyOf with keywords beside it, whose branches include a reference on
    a cycle, gets those keywords in each branch instead (``A and anyOf(B, C)`` is
    ``anyOf(A and B, A and C)``): llguidance would put them beside the reference
    itself, where it refuses them; beside it here, ``fix`` then inlines them."""
    applicators = [key for key in ("anyOf", "oneOf", "allOf") if key in node]
    if applicators != ["anyOf"]:  # a oneOf's branches stay as llguidance proves them apart
        return
    branches = node[applicators[0]]
    if not isinstance(branches, list) or not any(
        isinstance(b, dict) and isinstance(b.get("$ref"), str) and b["$ref"][1:] in cyclic
        for b in branches
    ):
        return
    shared = {
        key: value
        for key, value in node.items()
        if key not in _ANNOTATIONS and key not in _CONTAINERS and key != applicators[0]
    }
    if shared.get("additionalProperties") in ({}, True):
        del shared["additionalProperties"]
        del node["additionalProperties"]
    if not shared or "$ref" in shared:
        return
    for key in shared:
        del node[key]
    node[applicators[0]] = [_with(branch, shared) for branch in branches]


def _with(branch: Any, shared: dict) -> Any:
    """``branch`` and ``shared`` both applying, as one subschema."""
    if branch is False:
        return False
    if branch is True or branch == {}:
        return dict(shared)
    if isinstance(branch, dict) and (set(branch) == {"$ref"} or not branch.keys() & shared):
        return {**branch, **shared}
    return {"allOf": [branch, dict(shared)]}


def _merged(body: Any, siblings: dict) -> Any:
    """``body`` and ``siblings`` as one schema (both apply): keywords of one side only
    are taken, ``required`` joined, ``type`` intersected, and a property the siblings
    forbid (``false``) is forbidden whatever ``body`` said of it; anything else stays an
    ``allOf`` of the two."""
    if not isinstance(body, dict) or any(
        key in body and key not in ("required", "type", "properties") for key in siblings
    ):
        return {"allOf": [body, siblings]}
    out = dict(body)
    for key, value in siblings.items():
        if key == "required":
            out[key] = sorted(set(out.get(key, [])) | set(value))
        elif key == "type" and key in out:
            mine = {out[key]} if isinstance(out[key], str) else set(out[key])
            theirs = {value} if isinstance(value, str) else set(value)
            both = _types_both(mine, theirs)
            if not both:
                return False
            out[key] = sorted(both) if len(both) > 1 else both.pop()
        elif key == "properties" and key in out:
            if any(sub is not False for sub in value.values()):
                return {"allOf": [body, siblings]}
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _types_both(mine: set[str], theirs: set[str]) -> set[str]:
    """The JSON types in both sets (integer within number)."""
    out = mine & theirs
    if "number" in mine and "integer" in theirs or "number" in theirs and "integer" in mine:
        out.add("integer")
    return out


def _cyclic_targets(schema: dict) -> set[str]:
    """Every local $ref target's pointer if some chain of references is a cycle, else
    none. (Measured: llguidance refuses any reference with siblings once a cycle is
    being resolved, even one whose own target is acyclic, e.g. a branch beside one.)"""
    edges: dict[str, set[str]] = {}
    pending = [""]
    while pending:
        pointer = pending.pop()
        if pointer in edges:
            continue
        target = resolve_pointer(schema, pointer)
        edges[pointer] = refs = {
            node["$ref"][1:]
            for node in _nodes(target)
            if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#")
        }
        pending.extend(refs - edges.keys())
    if not any(_reaches(edges, p, {p}) for p in edges):
        return set()
    return {p for p in edges if p}


def _reaches(edges: dict[str, set[str]], start: str, goals: set[str]) -> bool:
    """Whether a chain of one or more references from ``start`` reaches ``goals``."""
    seen: set[str] = set()
    pending = list(edges.get(start, ()))
    while pending:
        pointer = pending.pop()
        if pointer in goals:
            return True
        if pointer not in seen:
            seen.add(pointer)
            pending.extend(edges.get(pointer, ()))
    return False


def _has_inner_refs(schema: dict) -> bool:
    return any(
        isinstance(node.get("$ref"), str) and not _points_at_definition(node["$ref"])
        for node in _nodes(schema)
    )


def _points_at_definition(ref: str) -> bool:
    """Whether ``ref`` is remote, the root, or one definition (left as it is)."""
    if not ref.startswith("#") or ref in ("#", "#/"):
        return True
    tokens = ref[1:].split("/")[1:]
    return len(tokens) == 2 and tokens[0] in _CONTAINERS


def _nodes(node: Any) -> Iterator[dict]:
    """Every subschema dict in ``node``, itself first (values that are data, such as an
    enum's, are not entered)."""
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, dict):
            yield current
            pending.extend(v for k, v in current.items() if k not in _DATA)
        elif isinstance(current, list):
            pending.extend(current)


def resolve_pointer(root: Any, pointer: str) -> Any:
    """The value at a JSON pointer ("/definitions/a~1b"; "" is the root), or None. A
    pointer from a URI fragment may be percent-encoded (``%5B`` for ``[``: RFC 6901,
    section 6): decoded first."""
    node = root
    for token in pointer.split("/")[1:] if pointer else []:
        token = urllib.parse.unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node
