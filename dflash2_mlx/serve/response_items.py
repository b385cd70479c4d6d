"""The output items of recent /v1/responses replies, by id, so that `item_reference` inputs
resolve. Responses are not stored (`store` is false), but some clients send earlier output
items back by reference all the same: the Vercel AI SDK's OpenAI provider does on every turn
after the first (its `store` defaults to true). Kept in memory, the newest first out last."""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict

from .api_error import APIError, invalid

MAX_ITEMS = 4096
MAX_CHARS = 32 << 20  # of the items' JSON: a bound on the memory they hold


class RecentItems:
    """`max_resolved`: the most characters of items one request's references may stand for
    (the body limit: a reference is no way to send more than a body may hold)."""

    def __init__(
        self, max_items: int = MAX_ITEMS, max_chars: int = MAX_CHARS, max_resolved: int = MAX_CHARS
    ):
        self.max_items, self.max_chars, self.max_resolved = max_items, max_chars, max_resolved
        self._items: OrderedDict[str, tuple[dict, int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def add(self, item: dict) -> None:
        size = len(json.dumps(item, ensure_ascii=False))
        with self._lock:
            if item["id"] in self._items:
                self._chars -= self._items.pop(item["id"])[1]
            self._items[item["id"]] = (copy.deepcopy(item), size)
            self._chars += size
            while self._items and (
                len(self._items) > self.max_items or self._chars > self.max_chars
            ):
                self._chars -= self._items.popitem(last=False)[1][1]

    def resolved(self, items: list) -> list:
        """`input` items with each `item_reference` replaced by the item it names."""
        out, size = [], 0
        for i, item in enumerate(items):
            if not (isinstance(item, dict) and item.get("type") == "item_reference"):
                out.append(item)
                continue
            ref = item.get("id")
            if not isinstance(ref, str):
                code = "missing_required_parameter" if ref is None else "invalid_type"
                raise invalid(f"input[{i}].id", f"input[{i}].id must be a string", code)
            with self._lock:
                found = self._items.get(ref)
            if found is None:
                raise invalid(
                    f"input[{i}].id",
                    f"input[{i}]: item {ref[:60]!r} is not one of this "
                    "server's recent replies (responses are not stored): send the item itself "
                    "(the Vercel AI SDK: providerOptions.openai.store = false)",
                    "unsupported_parameter",
                )
            size += found[1]
            if size > self.max_resolved:
                raise APIError(
                    413,
                    f"input: its item references stand for more than {self.max_resolved} "
                    "characters of items, more than a request body may hold",
                    param="input",
                    code="request_too_large",
                )
            out.append(copy.deepcopy(found[0]))
        return out
