"""Loading a pair for a front end (chat, serve, bench, evaluate): an alias or --target /
--drafter resolved, both fetched and loaded with the engine flags, the weights wired where a GPU
keeps them, and what the user should know said."""

from __future__ import annotations

import contextlib
from typing import Callable


def load_engine(
    model, target, drafter, offline: bool, say: Callable[[str], None], flags, *, sampling=True
):
    """`load_resolved`, then the engine settings (EngineSettings) the front end runs with:
    (pair, resolved, settings). `sampling` false: greedy (bench), whatever the target's
    generation_config.json says (a note says when it samples)."""
    from dflash2_mlx.errors import DFlash2Error
    from dflash2_mlx.settings import resolve_engine, resolve_sampling

    pair, resolved, target_dir = load_resolved(model, target, drafter, offline, say, flags)
    if not sampling:  # said when chat and serve would sample; a file they refuse: not said
        with contextlib.suppress(DFlash2Error):
            own = resolve_sampling({}, target_dir)
            if not own.params.greedy:
                say(f"note: measured greedy; the model samples by default ({own.describe()})")
    settings = resolve_engine(flags, pair, resolved, target_dir if sampling else None)
    pair.drafting, pair.width_cost = settings.drafting, settings.width_cost  # with the flags
    return pair, resolved, settings


def load_resolved(model, target, drafter, offline: bool, say: Callable[[str], None], flags):
    """Resolve an alias / --target / --drafter, fetch both, load the pair with `flags` (an
    EngineFlags): (pair, resolved, the target's folder)."""
    from dflash2_mlx import load_pair
    from dflash2_mlx.downloads import fetch
    from dflash2_mlx.memory import wire_weights
    from dflash2_mlx.registry import resolve

    resolved = resolve(model, target, drafter, offline=offline)
    tdir = fetch(resolved.target, "target", offline=offline)
    ddir = fetch(resolved.drafter, "drafter", offline=offline)
    alias = f"{resolved.alias}: " if resolved.alias else ""
    say(f"loading {alias}target {resolved.target} + drafter {resolved.drafter}")
    pair = load_pair(
        tdir,
        ddir,
        offline=offline,
        full_vocab=flags.full_vocab,
        draft_vocab_limit=flags.draft_vocab,
        lookup=flags.lookup_or_default,
        datastore=None if flags.datastore else False,  # None: when the drafter ships one
        chat_template=flags.chat_template,
        resolve_drafting=False,  # load_engine resolves it once, with the flags
    )
    tight = wire_weights(pair.model, pair.drafter)
    if tight:
        say(f"warning: {tight}")
    if flags.chat_template:
        say("chat template: from --chat-template")
    elif not getattr(pair.tokenizer, "has_chat_template", True):
        say(
            "note: the model has no chat template: messages go in as 'role: text' lines "
            "(chat and serve take --chat-template FILE)"
        )
    size = pair.drafter.draft_vocab_size
    if size is not None:
        short = flags.draft_vocab is not None and flags.draft_vocab > size
        say(
            f"draft vocabulary: {size:,} of {pair.drafter.config.vocab_size:,} tokens "
            + (
                f"(--draft-vocab {flags.draft_vocab:,}: the drafter lists only {size:,}; "
                if short
                else "("
            )
            + "--full-vocab for all)"
        )
    if pair.decoder.lookup:
        say(
            f"context lookup: after a repeat of the last {pair.decoder.lookup} tokens "
            "(--lookup 0: off)"
        )
    store = pair.decoder.datastore
    if store is not None:
        say(
            f"response datastore: {len(store):,} tokens of past answers, after a match of "
            f"{store.n}+ tokens, if {store.min_share:.0%} of its continuations agree "
            "(--no-datastore: off)"
        )
    return pair, resolved, tdir
