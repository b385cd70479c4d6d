"""Whether a JSON schema admits a finite value at all (`check_can_end`): a property it
requires that can only be written by writing itself again would run a reply to max_tokens.
Checked before the grammar is compiled (grammar.py); where unsure, it passes."""

from __future__ import annotations

from collections import deque

from .json_schema import _DATA_KEYS, _listed, _pointed


def check_can_end(schema) -> None:
    """ValueError where no finite value satisfies `schema` for sure: what it requires (a
    property, an array's first items) refers back to itself through $refs with no way out, so
    a reply could only run until max_tokens cuts it. Where unsure, it passes."""
    if not isinstance(schema, dict) or _has_ids(schema):  # $id scopes its $refs: unsure
        return
    targets = {r: _pointed(schema, r) for r in set(_all_refs(schema))}
    dependents: dict[str, set] = {r: set() for r in targets}
    for r, target in targets.items():
        for inner in set(_all_refs(target)):
            dependents[inner].add(r)
    ends = {r: False for r in targets}  # least fixpoint: a ref ends once its target can
    queue = deque(targets)
    while queue:  # a ref is looked at again only when one it holds has come to end
        r = queue.popleft()
        if not ends[r] and (targets[r] is None or _can_end(targets[r], ends)):
            ends[r] = True
            queue.extend(dependents[r])
    if not _can_end(schema, ends):
        raise ValueError(
            "no finite value satisfies it: something it requires (a property, an array's "
            "first items) can only be written by writing itself again, with no way out (make "
            "it optional, or allow null), or admits nothing (false)"
        )


def _has_ids(node) -> bool:
    """Whether a schema below the root has an `$id` (its $refs resolve against it)."""
    if isinstance(node, list):
        return any(_has_ids(v) for v in node)
    if not isinstance(node, dict):
        return False
    return any(
        k not in _DATA_KEYS and isinstance(v, (dict, list)) and (_id_in(v) or _has_ids(v))
        for k, v in node.items()
    )


def _id_in(node) -> bool:
    return isinstance(node, dict) and "$id" in node


def _all_refs(node):
    if isinstance(node, list):
        for v in node:
            yield from _all_refs(v)
    elif isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for k, v in node.items():
            if k not in _DATA_KEYS:
                yield from _all_refs(v)


def _can_end(node, ends: dict) -> bool:
    """Whether a finite value of `node` may exist, a $ref ending as `ends` says."""
    if node is False:
        return False
    if not isinstance(node, dict) or "const" in node or "enum" in node:
        return True
    if isinstance(node.get("$ref"), str) and not ends.get(node["$ref"], True):
        return False
    if not all(_can_end(b, ends) for b in _listed(node.get("allOf"))):
        return False
    for key in ("anyOf", "oneOf"):
        branches = _listed(node.get(key))
        if branches and not any(_can_end(b, ends) for b in branches):
            return False
    kinds = node.get("type", [])
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if not kinds or any(k not in ("object", "array") for k in kinds):
        return True  # a scalar ends it (or no type said: any value)
    return ("object" in kinds and _object_ends(node, ends)) or (
        "array" in kinds and _array_ends(node, ends)
    )


def _object_ends(node: dict, ends: dict) -> bool:
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = {k for k in _listed(node.get("required")) if isinstance(k, str)}
    if not all(_can_end(props[k], ends) for k in required if k in props):
        return False
    least = node.get("minProperties", 0)
    # closed for sure (closed_objects closes more, but not the branches and definitions other
    # schemas add keys to, which this node cannot tell)
    closed = node.get("additionalProperties") is False and "patternProperties" not in node
    if not closed or not isinstance(least, int) or least <= len(required):
        return True
    optional = sum(_can_end(v, ends) for k, v in props.items() if k not in required)
    return len(required) + optional >= least


def _array_ends(node: dict, ends: dict) -> bool:
    least = node.get("minItems", 0)
    least = least if isinstance(least, int) else 0
    prefix = _listed(node.get("prefixItems")) or _listed(node.get("items"))
    if not all(_can_end(b, ends) for b in prefix[:least]):
        return False
    rest = node.get("items") if not isinstance(node.get("items"), list) else None
    return least <= len(prefix) or rest is None or _can_end(rest, ends)
