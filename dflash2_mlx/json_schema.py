"""JSON schemas as the reply grammar takes them (grammar.py): objects closed to the keys they
list, and the references a tool's parameters may hold."""

from __future__ import annotations


_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})  # values, not schemas
# maps of names (which may be any word, "properties" too) to schemas
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_COMBINED = ("allOf", "anyOf", "oneOf", "$ref")  # keys other schemas add to the object
_OTHER_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# Formats held to a pattern of our own: llguidance's take second 60 at any hour, which
# pydantic and Python's datetime refuse (RFC 3339 allows it only in a leap second).
_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_FORMAT_PATTERNS = {"time": f"^{_TIME}$", "date-time": f"^{_DATE}T{_TIME}$"}


def closed_objects(schema):
    """`schema` with `additionalProperties: false` on every object schema that lists its
    `properties`, says nothing of other keys and takes no keys from a schema it is combined
    with: a reply holds the keys its schema names (what OpenAI's strict mode requires, and
    llama.cpp and XGrammar do by default), not whatever a small model adds until max_tokens
    cuts the JSON. Left open: objects beside allOf / anyOf / oneOf / $ref, the branches of
    such an object, and definitions an allOf extends. Say `additionalProperties: true` (or give
    a schema for them) to allow other keys anywhere. Times and date-times are held to seconds
    00-59 (_FORMAT_PATTERNS)."""
    extended = {str(r).rsplit("/", 1)[-1] for r in _refs(schema, inside_all_of=False)}

    def close(node, partial: bool = False):
        if isinstance(node, list):
            return [close(v) for v in node]
        if not isinstance(node, dict):
            return node
        has_props = isinstance(node.get("properties"), dict)
        out = {}
        for k, v in node.items():
            if k in _DATA_KEYS or k == "allOf":
                out[k] = v
            elif k in ("anyOf", "oneOf") and isinstance(v, list):
                out[k] = [close(b, partial=has_props) for b in v]
            elif k in _SCHEMA_MAPS and isinstance(v, dict):
                defs = k in ("$defs", "definitions")
                out[k] = {n: sub if defs and n in extended else close(sub) for n, sub in v.items()}
            else:
                out[k] = close(v)
        if node.get("format") in _FORMAT_PATTERNS and "pattern" not in node:
            out["pattern"] = _FORMAT_PATTERNS[out.pop("format")]
        combined = any(k in node for k in _COMBINED + _OTHER_KEYS)
        if has_props and not combined and not partial:
            out["additionalProperties"] = False
        return out

    return close(schema)


def without_format(schema, name: str):
    """`schema` with every `format: name` left out (data values kept as they are)."""
    if isinstance(schema, list):
        return [without_format(v, name) for v in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        k: v if k in _DATA_KEYS else without_format(v, name)
        for k, v in schema.items()
        if not (k == "format" and v == name)
    }


def _refs(node, inside_all_of: bool):
    """The $refs inside allOf lists of `node` (the definitions they extend)."""
    if isinstance(node, list):
        for v in node:
            yield from _refs(v, inside_all_of)
    elif isinstance(node, dict):
        if inside_all_of and "$ref" in node:
            yield node["$ref"]
        for k, v in node.items():
            if k not in _DATA_KEYS:
                yield from _refs(v, inside_all_of or k == "allOf")


def check_refs(name: str, schema) -> None:
    """References must point into `$defs` / `definitions`: the arguments' schema is nested in
    the call's, so a reference to its root (`#`) or its properties would point elsewhere."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if ref is not None and not str(ref).startswith(("#/$defs/", "#/definitions/")):
            raise ValueError(f"tool {name}: $ref {ref!r} (only #/$defs/... references)")
        if "x-guidance" in schema:
            raise ValueError(f"tool {name}: x-guidance is not supported in tool parameters")
        for v in schema.values():
            check_refs(name, v)
    elif isinstance(schema, list):
        for v in schema:
            check_refs(name, v)
