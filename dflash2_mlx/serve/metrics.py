"""Server counters and gauges, rendered in the Prometheus text exposition format (0.0.4)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from operator import attrgetter
from typing import Callable

from ..engine.events import RoundEvent
from ..engine.events import tau as tau_of
from ..engine.prompt_cache import PromptCacheStats
from .reasoning import ThinkingStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # rows verified together in a round
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)  # queue wait, seconds
_NO_CACHE = PromptCacheStats(0, 0, 0, 0, 0, 0)  # --prompt-cache-mb 0: its series read 0
PREFILL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)  # a prompt's prefill


class Histogram:
    """A Prometheus histogram: cumulative buckets (upper bounds), sum and count."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, help_: str) -> list[str]:
        out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for bound, n in zip(self.bounds, self.counts):
            out.append(f'{name}_bucket{{le="{bound}"}} {n}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {round(self.sum, 6)}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    """Thread-safe totals: the event loop counts requests, the worker counts rounds."""

    def __init__(self, model: str = ""):
        self._lock = threading.Lock()
        self.model = model  # the served name, in dflash2_info
        self.started = time.time()
        self.requests: Counter = Counter()  # (endpoint, status) -> responses
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.rounds = 0
        self.drafted = 0
        self.accepted = 0
        self.generations = 0
        self.cancelled = 0
        self.generation_seconds = 0.0
        self.queue_depth = 0  # waiting, not yet started
        self.tool_calls = 0
        self.unparsed_tool_calls = 0
        self.dropped_tool_calls = 0  # cut before their end (max_tokens, a stop string)
        self.reasoning = ThinkingStats()  # summed over finished chat replies
        self.in_flight = 0  # generating now (rows of the batch, and those joining it)
        self.batch_size = 0  # rows verified together in the latest round (0: idle)
        self.batch_rows = Histogram(ROWS_BUCKETS)  # per round
        self.queue_wait = Histogram(WAIT_BUCKETS)  # per request: submitted -> prefill starts
        self.prefill = Histogram(PREFILL_BUCKETS)  # per generation: its prompt's prefill
        self.cached_prompt_tokens = 0  # prompt tokens served by the prompt cache
        self.scored_prompt_tokens = 0  # prompt tokens scored for their log-probabilities (echo)
        self.prompt_cache: Callable[[], PromptCacheStats] | None = None  # its counters

    def count_response(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, str(status))] += 1

    def count_event(self, ev: RoundEvent) -> None:
        with self._lock:
            self.generated_tokens += len(ev.tokens)
            if ev.prefill:
                self.prefill.observe(ev.prefill_ms / 1000.0)
                self.prompt_tokens += ev.prompt_tokens + ev.reused_tokens
                self.cached_prompt_tokens += ev.reused_tokens
                return
            self.rounds += 1
            self.drafted += ev.drafted
            self.accepted += ev.accepted

    def count_scored(self, tokens: int) -> None:
        """A prompt scored for its own log-probabilities (by its prefill, or a pass of its
        own)."""
        with self._lock:
            self.scored_prompt_tokens += tokens

    def count_generation(self, seconds: float, cancelled: bool) -> None:
        with self._lock:
            self.generations += 1
            self.generation_seconds += seconds
            self.cancelled += int(cancelled)

    def count_reply(
        self, tool_calls: int, unparsed: int, thinking: ThinkingStats, dropped: int = 0
    ) -> None:
        """A finished chat reply: its tool calls (returned, refused by the parser, cut and
        dropped) and its thinking section."""
        with self._lock:
            self.tool_calls += tool_calls
            self.unparsed_tool_calls += unparsed
            self.dropped_tool_calls += dropped
            r = self.reasoning
            r.tokens, r.rounds = r.tokens + thinking.tokens, r.rounds + thinking.rounds
            r.drafted, r.accepted = r.drafted + thinking.drafted, r.accepted + thinking.accepted

    def count_dropped(self) -> None:
        """A waiting request whose client left before it started."""
        with self._lock:
            self.cancelled += 1

    def set_queue(self, waiting: int, running: int) -> None:
        with self._lock:
            self.queue_depth, self.in_flight = waiting, running
            if not running:
                self.batch_size = 0

    def count_batch_round(self, rows: int) -> None:
        """A round (one verify forward) over `rows` requests."""
        with self._lock:
            self.batch_size = rows
            self.batch_rows.observe(rows)

    def observe_queue_wait(self, seconds: float) -> None:
        with self._lock:
            self.queue_wait.observe(seconds)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round (accepted drafts + the bonus token)."""
        return tau_of(self.accepted, self.rounds)

    def render(self) -> str:
        from .._version import __version__ as version

        with self._lock:
            out = _Exposition()
            out.metric(
                "dflash2_info",
                "gauge",
                "The server: dflash2's version and the model's served name.",
                [((("version", version), ("model", _label(self.model))), 1)],
            )
            out.metric(
                "process_start_time_seconds",
                "gauge",
                "When the server started, in seconds since the epoch.",
                [((), round(self.started, 3))],
            )
            out.metric(
                "dflash2_requests_total",
                "counter",
                "HTTP responses by endpoint and status.",
                [
                    ((("endpoint", e), ("status", s)), n)
                    for (e, s), n in sorted(self.requests.items())
                ],
            )
            for name, kind, help_, attr in _SCALARS:
                value = attrgetter(attr)(self)
                out.metric(name, kind, help_, [((), _rounded(value))])
            out.lines += self.batch_rows.lines(
                "dflash2_batch_rows", "Requests verified together, per round."
            )
            out.lines += self.queue_wait.lines(
                "dflash2_queue_wait_seconds", "Per request: from queued to its prefill's start."
            )
            out.lines += self.prefill.lines(
                "dflash2_prefill_seconds",
                "Per generation: its prompt's prefill (time to first token: queue wait + this).",
            )
            out.metric(
                "dflash2_cached_prompt_tokens_total",
                "counter",
                "Prompt tokens served by the prompt cache (not prefilled).",
                [((), self.cached_prompt_tokens)],
            )
            cache = self.prompt_cache() if self.prompt_cache is not None else _NO_CACHE
            _prompt_cache_metrics(out.metric, cache)
            _memory_metrics(out.metric)
            return "\n".join(out.lines) + "\n"


# The unlabelled counters and gauges, in the order they are rendered: (name, kind, help, attribute).
_SCALARS = (
    (
        "dflash2_prompt_tokens_total",
        "counter",
        "Prompt tokens of started generations (each choice of an n > 1 request counts its own).",
        "prompt_tokens",
    ),
    (
        "dflash2_scored_prompt_tokens_total",
        "counter",
        "Prompt tokens scored for their own log-probabilities (a completion's echo with "
        "logprobs: by its prefill, or a pass of its own with max_tokens 0).",
        "scored_prompt_tokens",
    ),
    (
        "dflash2_generated_tokens_total",
        "counter",
        "Tokens committed by the engine (a round past a stop string included: usage counts the reply's).",
        "generated_tokens",
    ),
    (
        "dflash2_rounds_total",
        "counter",
        "Draft-verify rounds (the prefill is not a round).",
        "rounds",
    ),
    ("dflash2_drafted_tokens_total", "counter", "Draft tokens proposed.", "drafted"),
    (
        "dflash2_accepted_tokens_total",
        "counter",
        "Draft tokens accepted by the target.",
        "accepted",
    ),
    (
        "dflash2_generations_total",
        "counter",
        "Generations run (finished or cancelled).",
        "generations",
    ),
    (
        "dflash2_cancelled_total",
        "counter",
        "Requests cancelled by a client disconnect (waiting or generating).",
        "cancelled",
    ),
    ("dflash2_tool_calls_total", "counter", "Tool calls returned in chat replies.", "tool_calls"),
    (
        "dflash2_unparsed_tool_calls_total",
        "counter",
        "Tool-call texts the tool parser refused (returned as content).",
        "unparsed_tool_calls",
    ),
    (
        "dflash2_dropped_tool_calls_total",
        "counter",
        "Tool calls cut before their end (max_tokens, a stop string): dropped, no content.",
        "dropped_tool_calls",
    ),
    (
        "dflash2_reasoning_tokens_total",
        "counter",
        "Generated tokens inside thinking sections (markers included).",
        "reasoning.tokens",
    ),
    (
        "dflash2_reasoning_rounds_total",
        "counter",
        "Draft-verify rounds that began inside a thinking section.",
        "reasoning.rounds",
    ),
    (
        "dflash2_reasoning_accepted_tokens_total",
        "counter",
        "Draft tokens accepted in rounds inside thinking sections.",
        "reasoning.accepted",
    ),
    (
        "dflash2_generation_seconds_total",
        "counter",
        "Seconds of generation summed over generations (concurrent ones each count theirs: "
        "not a busy ratio).",
        "generation_seconds",
    ),
    (
        "dflash2_mean_acceptance_length",
        "gauge",
        "Mean tokens per round, bonus included (tau), since start.",
        "tau",
    ),
    ("dflash2_queue_depth", "gauge", "Requests waiting for the worker.", "queue_depth"),
    (
        "dflash2_in_flight",
        "gauge",
        "Generations running now (rows of the batch and those joining it).",
        "in_flight",
    ),
    (
        "dflash2_batch_size",
        "gauge",
        "Requests verified together in the latest round (0: idle).",
        "batch_size",
    ),
)


def _rounded(value: int | float) -> int | float:
    """Seconds and means to 6 decimals; counts as they are."""
    return round(value, 6) if isinstance(value, float) else value


class _Exposition:
    """The lines of a Prometheus text exposition, built metric by metric."""

    def __init__(self):
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, samples) -> None:
        """HELP and TYPE, then one line per (labels, value) sample."""
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{v}"' for k, v in labels)
            self.lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")


def _label(value: str) -> str:
    """A label value as the exposition format escapes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _memory_metrics(metric) -> None:
    """MLX's memory now and at its peak (weights, caches, the prompt cache, buffers)."""
    import mlx.core as mx

    for name, help_, value in (
        ("dflash2_mlx_active_memory_bytes", "Memory MLX holds now.", mx.get_active_memory()),
        (
            "dflash2_mlx_peak_memory_bytes",
            "The most MLX has held since start.",
            mx.get_peak_memory(),
        ),
        (
            "dflash2_mlx_cache_memory_bytes",
            "Freed buffers MLX keeps for reuse (returned when the server is idle).",
            mx.get_cache_memory(),
        ),
    ):
        metric(name, "gauge", help_, [((), value)])


def _prompt_cache_metrics(metric, st: PromptCacheStats) -> None:
    for name, help_, value in (
        ("dflash2_prompt_cache_hits_total", "Requests that resumed a cached prefix.", st.hits),
        ("dflash2_prompt_cache_misses_total", "Requests that started cold.", st.misses),
        (
            "dflash2_prompt_cache_evictions_total",
            "Entries dropped to stay within the budget.",
            st.evictions,
        ),
    ):
        metric(name, "counter", help_, [((), value)])
    metric(
        "dflash2_prompt_cache_entries", "gauge", "Conversation states stored.", [((), st.entries)]
    )
    metric(
        "dflash2_prompt_cache_bytes", "gauge", "Bytes held by the stored states.", [((), st.nbytes)]
    )
    metric(
        "dflash2_prompt_cache_max_bytes",
        "gauge",
        "The prompt cache's budget.",
        [((), st.max_bytes)],
    )
