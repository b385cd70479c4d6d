"""The per-round costs the autotuner and `dflash2 bench` measure, on a warm cache.

Timed as dependent chains: each timed call's input is computed from the previous call's output
(so no two calls can overlap), each call is evaluated before the next starts (as in the
engine), and widths are interleaved across repeats so that drift affects them alike. Each
returns a plain dict, ready for JSON (stored in autotune profiles).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import mlx.core as mx

from .sampling import SamplingParams
from .errors import ParameterError
from .target import batch as tbatch

# A wider verify timed this many times cheaper than one token, and by more than a few ms (a
# tiny model's timings are mostly overhead and jitter): the timings are not trusted.
IMPLAUSIBLE, JITTER_MS = 1.5, 10.0


def context_ids(vocab: int, n: int) -> list[int]:
    """A deterministic, non-repeating-looking context of n token ids below `vocab`."""
    return [(i * 7919 + 13) % vocab for i in range(n)]


# ----------------------------------------------------------------------------- cost curves
def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000.0, 4)


def check_context(pair, context: int, width: int, name: str = "context") -> None:
    """A ParameterError (naming `name`) unless a cache of `context` tokens plus `width` more fits
    the model."""
    from .target.context import default_context_length

    limit = default_context_length(pair.model)
    if context + width > limit:
        raise ParameterError(
            f"{name}: {context} tokens plus a verify of {width} (the widest measured) exceed "
            f"the model's context ({limit} tokens)"
        )


def verify_costs(
    pair, widths: Iterable[int], *, context: int = 256, repeats: int = 5, warmup: int = 1
) -> dict:
    """The target's cost of one verify forward of each width (anchor + width-1 drafts) on a warm
    cache holding `context` tokens: median ms per width, and cost(w)/cost(smallest w).

    Timed as in the engine: forward, argmax read back (a sync), cache state evaluated; the next
    call's first token is this call's last argmax (a dependent chain). The cache is rolled back
    after each call (outside the timing), so every call sees the same depth (± the few rows a
    recurrent cache keeps)."""
    widths = sorted({int(w) for w in widths})
    check_context(pair, context, max(widths))
    adapter = pair.decoder.target
    vocab = adapter.vocab_size
    cache = adapter.make_cache()
    ctx = context_ids(vocab, max(context, 1))
    adapter.prefill(mx.array([ctx]), cache, pair.decoder.prefill_chunk, 1)
    trimmable = all(c.is_trimmable() for c in cache)
    token = ctx[-1]
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(warmup + repeats):
        order = widths[rep % len(widths) :] + widths[: rep % len(widths)]  # rotate the order
        for w in order:
            ids = mx.array([[token] + [(token + 17 * j) % vocab for j in range(1, w)]])
            t0 = time.perf_counter()
            fwd = adapter.forward(ids, cache)
            nxt = mx.argmax(fwd.logits[0], axis=-1).tolist()
            mx.eval(fwd.features, [c.state for c in cache])
            dt = time.perf_counter() - t0
            adapter.rollback(cache, fwd, 1, w)
            if trimmable:
                for c in cache:
                    c.trim(1)
            token = int(nxt[-1])
            if rep >= warmup:
                samples[w].append(dt)
    ms = {w: _median_ms(samples[w]) for w in widths}
    base = ms[widths[0]] or float("nan")
    return {
        "context": context,
        "repeats": repeats,
        "ms": ms,
        "ratio": {w: round(ms[w] / base, 4) for w in widths},
    }


def batch_verify_costs(
    pair,
    batches: Iterable[int],
    widths: Iterable[int],
    *,
    context: int = 256,
    repeats: int = 3,
    warmup: int = 1,
) -> dict:
    """Median ms of one verify forward of B rows x W tokens ({B: {W: ms}}), timed as in
    bench.verify_costs (forward, argmax read back, cache evaluated; a dependent chain) on a
    batch cache whose rows hold `context` tokens, less a few for each later row (ragged, as in
    the engine). Row count 1 is bench.verify_costs itself. Each call is rolled back after
    timing (outside it), so every call sees the same depths."""
    adapter = pair.decoder.target
    widths = sorted({int(w) for w in widths})
    table: dict[int, dict[int, float]] = {}
    for rows in sorted({int(b) for b in batches}):
        if rows == 1:
            table[1] = verify_costs(pair, widths, context=context, repeats=repeats)["ms"]
            continue
        singles = []
        for r in range(rows):
            cache = adapter.make_cache()
            ctx = context_ids(adapter.vocab_size, max(context - 3 * r, 1))
            adapter.prefill(mx.array([ctx]), cache, pair.decoder.prefill_chunk, 1)
            singles.append(cache)
        cache = tbatch.merge(singles)
        samples: dict[int, list[float]] = {w: [] for w in widths}
        token = 1
        for rep in range(warmup + repeats):
            for w in widths[rep % len(widths) :] + widths[: rep % len(widths)]:
                ids = mx.array(
                    [
                        [(token + 17 * j + r) % adapter.vocab_size for j in range(w)]
                        for r in range(rows)
                    ]
                )
                t0 = time.perf_counter()
                fwd = adapter.forward(ids, cache.layers)
                nxt = mx.argmax(fwd.logits[:, -1], axis=-1).tolist()
                mx.eval(fwd.features, [c.state for c in cache.layers])
                dt = time.perf_counter() - t0
                tbatch.rollback(cache, fwd, [0] * rows, w)
                token = int(nxt[0])
                if rep >= warmup:
                    samples[w].append(dt)
        table[rows] = {w: _median_ms(samples[w]) for w in widths}
    return {"context": context, "repeats": repeats, "ms": table}


def draft_costs(
    pair,
    blocks: Iterable[int],
    *,
    context: int = 256,
    repeats: int = 5,
    warmup: int = 1,
    feature_rows: int = 2,
) -> dict:
    """The drafter's cost of one round at each block size b (b - 1 drafted tokens): embed the
    block, run the drafter over `feature_rows` new context rows, logits, and (DFlash2) the
    candidate path selector; drafts read back (a sync). Block 1 drafts nothing: 0 ms.
    Median ms per block; the drafter cache is trimmed back after each call.

    Timed through `Drafter.draft_block`, the call the engine makes in a drafter round."""
    blocks = sorted({int(b) for b in blocks})
    check_context(pair, context, max(blocks))
    drafter, target = pair.drafter, pair.decoder.target
    vocab = target.vocab_size
    sp = SamplingParams(temperature=0.0)
    key = mx.random.key(0)
    ctx = context_ids(vocab, max(context, feature_rows + 1))
    cache = drafter.make_cache()
    _, features, _ = target.prefill(
        mx.array([ctx]), target.make_cache(), pair.decoder.prefill_chunk, None
    )
    token = ctx[-1]
    # First call consumes the whole context (building the drafter's context cache).
    drafter.draft_block(token, 2, features, cache, sp, key).tokens.tolist()
    full = target.forward(mx.array([ctx[-feature_rows:]]), None).features
    mx.eval(full)
    samples: dict[int, list[float]] = {b: [] for b in blocks if b > 1}
    drafted = sorted(samples)
    for rep in range(warmup + repeats):
        order = drafted[rep % max(len(drafted), 1) :] + drafted[: rep % max(len(drafted), 1)]
        for b in order:
            t0 = time.perf_counter()
            tokens = drafter.draft_block(token, b, full, cache, sp, key).tokens.tolist()
            dt = time.perf_counter() - t0
            for c in cache:
                c.trim(feature_rows)
            token = int(tokens[-1]) if tokens else token
            if rep >= warmup:
                samples[b].append(dt)
    ms = {b: (_median_ms(samples[b]) if b > 1 else 0.0) for b in blocks}
    return {"context": context, "repeats": repeats, "feature_rows": feature_rows, "ms": ms}


@dataclass(frozen=True)
class Costs:
    """Verify per width, batched verify per rows and width, draft per block (as returned)."""

    verify: dict
    batch_verify: dict
    draft: dict


def measure_costs(
    pair,
    widths: list[int],
    *,
    blocks: Iterable[int],
    batches: tuple[int, ...],
    batch_widths: list[int],
    context: int,
    repeats: int,
    say: Callable[[str], None],
) -> Costs:
    """All three cost curves the autotuner needs, announcing each through `say`."""
    blocks = list(blocks)
    say(f"verify cost, widths {', '.join(map(str, widths))}, context {context}")
    verify = verify_costs(pair, widths, context=context, repeats=repeats)
    if batches:
        say(f"batched verify cost, rows {', '.join(map(str, batches))}")
    batch_verify = batch_verify_costs(
        pair, batches, batch_widths, context=context, repeats=max(1, repeats // 2)
    )
    say(f"draft cost, blocks 2..{max(blocks)}")
    draft = draft_costs(pair, blocks, context=context, repeats=repeats)
    return Costs(verify, batch_verify, draft)


def check_plausible(verify_ms: Mapping[int, float]) -> None:
    """A verify timed well above a wider one (BLAS kernels favour some widths, by ~1.25x at
    most as measured): the load changed while they ran (a busy machine), and a block chosen
    from such costs would be wrong for every later run."""
    for w in sorted(verify_ms):
        wider = min((x for x in verify_ms if x > w), key=verify_ms.get, default=None)
        if wider is not None and verify_ms[wider] * IMPLAUSIBLE + JITTER_MS < verify_ms[w]:
            took = "one token took" if w == 1 else f"{w} tokens took"
            raise ParameterError(
                f"autotune: the verify timings are not plausible: {took} "
                f"{verify_ms[w]:.1f} ms, {wider} tokens {verify_ms[wider]:.1f} ms (was the "
                "machine busy?); nothing was stored: rerun it on a quiet machine"
            )
