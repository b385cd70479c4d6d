"""JSON schemas as the reply grammar takes them (grammar.py): objects closed to the keys they
list, and the references a tool's parameters may hold."""

from __future__ import annotations

from .values import is_number


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
# Dates that exist (Python's datetime and pydantic refuse 2023-02-30 and 0000-01-01): days by
# month, February 29 in leap years only (every 4th, but centuries only every 400th).
_YEAR = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)"
_DAYS = "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
_DATE = f"({_YEAR}-{_DAYS}|{_LEAP}-02-29)"
_FORMAT_PATTERNS = {"time": f"^{_TIME}$", "date": f"^{_DATE}$", "date-time": f"^{_DATE}T{_TIME}$"}
# Numbers a small model may write until max_tokens cuts the JSON (1111…, 0.0000…): integers
# within 2**53 - 1 (16 digits, held exactly by llguidance's doubles and by JavaScript's
# numbers) and numbers within 1e16 on each side the schema leaves open (a number's own bounds
# held within 9e17), and 10 decimals (no exponent) where it bounds neither side.
_INTEGER_LIMIT = 2**53 - 1
_NUMBER_LIMIT = 1e16
_NUMBER_BOUND = 9e17  # a number schema's own bounds: llguidance writes no range from 1e18 on
_DECIMALS = 1e-10  # a multipleOf: llguidance takes no finer one


def closed_objects(schema):
    """`schema` with `additionalProperties: false` on every object schema that lists its
    `properties`, says nothing of other keys and takes no keys from a schema it is combined
    with: a reply holds the keys its schema names (what OpenAI's strict mode requires, and
    llama.cpp and XGrammar do by default), not whatever a small model adds until max_tokens
    cuts the JSON. Left open: objects beside allOf / anyOf / oneOf / $ref, the branches of
    such an object, and definitions an allOf extends. Say `additionalProperties: true` (or give
    a schema for them) to allow other keys anywhere. Times and date-times are held to seconds
    00-59 and dates to real days (_FORMAT_PATTERNS); numbers to 16 digits and 10 decimals unless the schema bounds
    them (_numbers_bounded); a map whose keys are an enum (pydantic's dict[Literal[...], T])
    lists them as its properties (_keys_listed)."""
    extended = {str(r).rsplit("/", 1)[-1] for r in _refs(schema, inside_all_of=False)}
    definitions = {}
    if isinstance(schema, dict):
        for k in ("$defs", "definitions"):
            definitions.update(schema.get(k) if isinstance(schema.get(k), dict) else {})

    def close(node, partial: bool = False):
        if isinstance(node, list):
            return [close(v) for v in node]
        if not isinstance(node, dict):
            return node
        node = _lengths_held(_numbers_bounded(_keys_listed(node, definitions)))
        has_props = isinstance(node.get("properties"), dict)
        out = {}
        for k, v in node.items():
            if k in _DATA_KEYS:
                out[k] = v
            elif k == "allOf":  # not closed (it extends), but bounded
                out[k] = _bounds_held(v)
            elif k in ("anyOf", "oneOf") and isinstance(v, list):
                out[k] = [close(b, partial=has_props) for b in v]
            elif k in _SCHEMA_MAPS and isinstance(v, dict):
                defs = k in ("$defs", "definitions")
                out[k] = {
                    n: _bounds_held(sub) if defs and n in extended else close(sub)
                    for n, sub in v.items()
                }
            else:
                out[k] = close(v)
        if node.get("format") in _FORMAT_PATTERNS and "pattern" not in node:
            out["pattern"] = _FORMAT_PATTERNS[out.pop("format")]
        combined = any(k in node for k in _COMBINED + _OTHER_KEYS)
        if has_props and not combined and not partial:
            out["additionalProperties"] = False
            # a key it requires without a schema stays allowed (any value), as when open
            required = node.get("required") if isinstance(node.get("required"), list) else []
            unlisted = {
                k: {} for k in required if isinstance(k, str) and k not in node["properties"]
            }
            if unlisted:
                out["properties"] = {**out["properties"], **unlisted}
        return out

    return close(schema)


_VALUES_GIVEN = ("enum", "const", "allOf", "anyOf", "oneOf", "$ref", "not")


def _bounds_held(node):
    """`node` with the bounds every schema in it gives held where the grammar engine can
    follow them (_bounds_within, _lengths_held), no open side bounded and no object closed:
    the branches of an allOf and the definitions one extends, whose siblings may bound what
    one branch leaves open."""
    if isinstance(node, list):
        return [_bounds_held(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    types = out.get("type") if isinstance(out.get("type"), list) else [out.get("type")]
    _bounds_within(out, "integer" if set(types) == {"integer"} else "number")
    out = _lengths_held(out)
    for k, v in out.items():
        if k in _SCHEMA_MAPS and isinstance(v, dict):  # schemas by name: a key is a name
            out[k] = {name: _bounds_held(sub) for name, sub in v.items()}
        elif k not in _DATA_KEYS:
            out[k] = _bounds_held(v)
    return out


_LENGTH_LIMIT = 2**32 - 1  # llguidance's regex repetition counts are 32-bit


def _lengths_held(node: dict) -> dict:
    """A string's maxLength past what the grammar engine counts is dropped (no reply is that
    long: it bounds nothing); a minLength past it is a ValueError (no reply could meet it)."""
    high, low = node.get("maxLength"), node.get("minLength")
    if is_number(low) and low > _LENGTH_LIMIT:
        raise ValueError(f"minLength {low}: no reply can be that long")
    if is_number(high) and high > _LENGTH_LIMIT:
        return {k: v for k, v in node.items() if k != "maxLength"}
    return node


def _numbers_bounded(node: dict) -> dict:
    """An integer or number schema with the digits it may take bounded (see _INTEGER_LIMIT):
    each side the schema leaves open, where that keeps a value possible. Left as they are:
    schemas whose values come from elsewhere too (an enum, a const, a combinator)."""
    if any(k in node for k in _VALUES_GIVEN):
        return node
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    if "number" in types:
        limit = _NUMBER_LIMIT
    elif "integer" in types:
        limit = _INTEGER_LIMIT
    else:
        return node
    out = dict(node)
    if limit == _NUMBER_LIMIT:  # llguidance writes no regex for a range from 1e18 on
        _bounds_within(out, "number")
    elif set(types) <= {"integer"}:  # held within what doubles hold
        _bounds_within(out, "integer")
    low = next((out[k] for k in ("minimum", "exclusiveMinimum") if k in out), None)
    high = next((out[k] for k in ("maximum", "exclusiveMaximum") if k in out), None)
    if high is None and not (is_number(low) and low >= limit):
        out["maximum"] = limit
    if low is None and not (is_number(high) and high <= -limit):
        out["minimum"] = -limit
    if "number" in types and low is None and high is None and "multipleOf" not in node:
        out["multipleOf"] = _DECIMALS
    return out


# each bound key, and its value at the limit (an integer's exclusive one a step past it)
_AT_LIMIT = {
    "integer": {
        "maximum": _INTEGER_LIMIT,
        "exclusiveMaximum": _INTEGER_LIMIT + 1,
        "minimum": -_INTEGER_LIMIT,
        "exclusiveMinimum": -_INTEGER_LIMIT - 1,
    },
    "number": {
        "maximum": _NUMBER_BOUND,
        "exclusiveMaximum": _NUMBER_BOUND,
        "minimum": -_NUMBER_BOUND,
        "exclusiveMinimum": -_NUMBER_BOUND,
    },
}
_HELD = {
    "integer": "integers are held within ±(2**53 - 1), where doubles and JavaScript keep "
    "every digit",
    "number": "numbers are held within ±9e17 (the grammar engine writes no wider range)",
}


def _bounds_within(out: dict, kind: str) -> None:
    """A `kind` ("integer" or "number") schema's bounds past its limit, each replaced in `out`
    by the limit on its side, which only narrows what it allows (another, tighter bound on
    that side stays); a ValueError where no value within the limit remains. Integers: llguidance
    rounds bounds to doubles (2**53 passed a minimum of 2**53 + 1); numbers: it fails on a
    range from 1e18 on with a message of its own internals."""
    for key, at in _AT_LIMIT[kind].items():
        v = out.get(key)
        if not is_number(v):
            continue
        upper = key.endswith("aximum")
        if (v < -at) if upper else (v > -at):  # nothing within the limit is left
            raise ValueError(f"{kind} bound {key} {v}: {_HELD[kind]}")
        if (v > at) if upper else (v < at):
            out[key] = at


def _keys_listed(node: dict, defs: dict) -> dict:
    """A map whose `propertyNames` is an enum or a const (directly or by a $ref to one), which
    llguidance does not take, as the same object with those names as its optional properties
    and no other keys."""
    names = node.get("propertyNames")
    if not isinstance(names, dict) or "properties" in node or "patternProperties" in node:
        return node
    ref = names.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        names = defs.get(ref.rsplit("/", 1)[-1], {})
    keys = names.get("enum", [names["const"]] if "const" in names else None)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return node
    value = node.get("additionalProperties", True)
    out = {k: v for k, v in node.items() if k not in ("propertyNames", "additionalProperties")}
    return {**out, "properties": {k: value for k in keys}, "additionalProperties": False}


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


# llguidance checks that the regexes one value must match at once (allOf's patterns) leave
# something to write, in time and memory exponential in their number (search patterns: 16 took
# 2 s, 18 took 29 s and 2 GB, 20 over a minute and 3 GB, on one thread that every request's
# prompt waits behind): a schema asking more is refused before it is compiled.
MAX_PATTERNS_AT_ONCE = 8
_REGEX_KEYS = ("pattern", "format")  # a format is a regex to llguidance too


def patterns_at_once(schema) -> int:
    """The most regexes (`pattern`, `format`) one value of `schema` must match together: the
    branches of allOf and a $ref (a JSON pointer from the root) merged into the schema holding
    them, by where they apply — a property by its name, where additionalProperties and every
    patternProperties apply too; an item by its place, where `items` applies too — and an
    anyOf / oneOf alternative counted by its largest."""
    counts = _RegexCounts(schema).at(schema)
    wild = {where: n for where, n in counts.items() if _ANY in where}
    if len(wild) > 256:  # too many places to pair up: refused as that many
        return len(wild)
    return max((n + _meeting(wild, at) for at, n in counts.items()), default=0)


_ANY = "*"  # a place that any name (or index) stands in: additionalProperties, items


def _meeting(wild: dict, at: tuple) -> int:
    """The regexes of the other places written with _ANY where `at` has a name or index."""
    return sum(
        n
        for where, n in wild.items()
        if where != at and len(where) == len(at) and all(w in (a, _ANY) for w, a in zip(where, at))
    )


class _RegexCounts:
    """{place: regexes} of a schema's values (place: ("p", name) / ("i", index) steps)."""

    def __init__(self, root):
        self.root, self.refs = root, {}  # a $ref's counts, once (a cycle adds nothing more)

    def at(self, node) -> dict:
        out: dict = {}
        if not isinstance(node, dict):
            return out
        _add(out, {(): sum(isinstance(node.get(k), str) for k in _REGEX_KEYS)})
        for branch in _listed(node.get("allOf")):
            _add(out, self.at(branch))
        if isinstance(node.get("$ref"), str):
            _add(out, self._ref(node["$ref"]))
        for key in ("anyOf", "oneOf"):
            most: dict = {}
            for branch in _listed(node.get(key)):
                for where, n in self.at(branch).items():
                    most[where] = max(most.get(where, 0), n)
            _add(out, most)
        for step, child in _children(node):
            _add(out, self.at(child), step)
        return out

    def _ref(self, ref: str) -> dict:
        if ref not in self.refs:
            self.refs[ref] = {}
            self.refs[ref] = self.at(_pointed(self.root, ref))
        return self.refs[ref]


def _add(out: dict, more: dict, step: tuple = ()) -> None:
    for where, n in more.items():
        if n:
            out[step + where] = out.get(step + where, 0) + n


def _listed(value) -> list:
    return value if isinstance(value, list) else []


def _children(node: dict):
    """(place step, subschema) of the values inside `node`'s."""
    for name, child in (
        (node.get("properties") or {}).items() if isinstance(node.get("properties"), dict) else ()
    ):
        yield ("p", name), child
    for child in (
        (node.get("patternProperties") or {}).values()
        if isinstance(node.get("patternProperties"), dict)
        else ()
    ):
        yield ("p", _ANY), child
    for key, step in (("additionalProperties", ("p", _ANY)), ("contains", ("i", _ANY))):
        yield step, node.get(key)
    items = node.get("items")
    if isinstance(items, list):  # the older form of prefixItems
        yield from ((("i", i), child) for i, child in enumerate(items))
    else:
        yield ("i", _ANY), items
    yield ("i", _ANY), node.get("additionalItems")
    yield from ((("i", i), child) for i, child in enumerate(_listed(node.get("prefixItems"))))


def _pointed(root, ref: str):
    """What a JSON pointer `ref` ("#/$defs/A/properties/b") names in `root`; None: nothing."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def check_patterns_at_once(schema) -> None:
    """ValueError where one value must match more regexes together than can be checked in
    reasonable time (MAX_PATTERNS_AT_ONCE)."""
    n = patterns_at_once(schema)
    if n > MAX_PATTERNS_AT_ONCE:
        raise ValueError(
            f"one value must match {n} patterns or formats at once (allOf); at most "
            f"{MAX_PATTERNS_AT_ONCE}: checking that they leave anything to write grows "
            "exponentially with their number"
        )
