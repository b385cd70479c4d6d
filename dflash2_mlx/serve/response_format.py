"""`response_format` in a chat body -> the JSON schema the reply must follow (None: free text);
serve/constrained.py turns it into the reply's grammar."""

from __future__ import annotations

from .api_error import brief, invalid

_JSON_SCHEMA_KEYS = {"name": str, "description": str, "schema": dict, "strict": bool}


def parse_response_format(value) -> dict | None:
    """OpenAI's response_format -> the JSON schema the reply must follow (None: free text).
    json_object: any JSON object; json_schema: its `schema` (strict or not, the reply
    follows it exactly: it is enforced token by token)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("response_format", "response_format must be an object", "invalid_type")
    kind = value.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if not isinstance(kind, str) or kind not in allowed:
        raise invalid(
            "response_format.type",
            f"response_format.type must be text, json_object or json_schema; got {brief(kind)}",
        )
    for k in value:
        if k not in allowed[kind]:
            raise invalid(
                f"response_format.{k}",
                f"response_format.{k} is not supported with type {kind}",
                "unsupported_parameter",
            )
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid(
            "response_format.json_schema",
            "response_format.json_schema must be an object with a schema",
            "invalid_type" if spec is not None else "missing_required_parameter",
        )
    for k, v in spec.items():
        where = f"response_format.json_schema.{k}"
        if k not in _JSON_SCHEMA_KEYS:
            raise invalid(where, f"{where} is not supported", "unsupported_parameter")
        if v is not None and not isinstance(v, _JSON_SCHEMA_KEYS[k]):
            kind_name = {str: "a string", dict: "an object", bool: "a boolean"}[
                _JSON_SCHEMA_KEYS[k]
            ]
            raise invalid(where, f"{where} must be {kind_name}", "invalid_type")
    schema = spec.get("schema")
    if isinstance(schema, dict) and "x-guidance" in schema:  # its "lenient" lets keywords the
        # grammar cannot enforce pass unenforced: a reply would claim a schema it breaks
        where = "response_format.json_schema.schema.x-guidance"
        raise invalid(where, f"{where}: the grammar engine's own options are not supported")
    return {"type": "object"} if schema is None else schema
