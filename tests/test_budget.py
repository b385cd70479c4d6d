"""A thinking budget (engine/budget.py) is a constraint like any other: the output is plain
decoding under the same rule, one token at a time — checked on dense and hybrid targets, alone
and beside another constraint, with one- and two-token end markers, drafts accepted through
the forced marker and refused."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from test_constraint import PROMPTS, decoder, reference  # noqa: F401  (decoder: fixture)

from dflash2_mlx import GenerationParams
from dflash2_mlx.engine.budget import AllOf, BothFactories, ThinkingBudget

START, END = (5,), (6,)


def budget(end=END, n=3, opened=True):
    return ThinkingBudget.factory(START, end, n, tiny.VOCAB, opened)


def test_the_marker_comes_after_the_budget_and_output_is_plain_decoding(decoder):  # noqa: F811
    model, dec = decoder
    for prompt in PROMPTS:
        for end, n in ((END, 3), ((6, 7), 2), (END, 0)):
            ref = reference(model, prompt, 20, budget(end, n)())
            k = ref.index(end[0])  # the model may close it sooner; never later
            assert k <= n and tuple(ref[k : k + len(end)]) == end, ref
            for block, predicted in ((2, ()), (8, ()), (4, tuple(ref))):
                params = GenerationParams(
                    max_tokens=20, block_size=block, prediction=predicted, constraint=budget(end, n)
                )
                events = list(dec.stream(prompt, params))
                assert [t for ev in events for t in ev.tokens] == ref, (block, end, n)


class Odd:
    """Only odd tokens (and the end marker): a companion constraint that never fights it."""

    def allowed(self, drafts):
        row = (np.arange(tiny.VOCAB) % 2 == 1) | (np.arange(tiny.VOCAB) == END[0])
        return np.stack([row] * (len(drafts) + 1))

    def commit(self, tokens):
        pass

    def forced(self):
        return []


def test_a_budget_beside_another_constraint(decoder):  # noqa: F811
    model, dec = decoder
    prompt = PROMPTS[0]
    ref = reference(model, prompt, 16, AllOf(Odd(), budget(n=4)()))
    k = ref.index(END[0])
    assert k <= 4 and all(t % 2 or t == END[0] for t in ref)
    both = BothFactories(Odd, budget(n=4))
    params = GenerationParams(max_tokens=16, constraint=both)
    assert [t for ev in dec.stream(prompt, params) for t in ev.tokens] == ref


def test_a_section_the_reply_opens_with_is_budgeted_and_later_markers_are_text():
    b = budget(n=2, opened=False)()
    rows = b.allowed([5, 1, 2])  # 5 opens; 1, 2 fill the budget; then only 6
    assert rows[:3].all() and rows[3].sum() == 1 and rows[3][6]
    b.commit([5, 1, 2])
    assert b.forced() == [6]
    b.commit([6])
    assert b.forced() == [] and b.allowed([5, 1, 2, 3]).all()  # one section a reply
    late = budget(n=1, opened=False)()
    assert late.allowed([9, 5, 1, 2, 3]).all()  # a marker inside the answer is text


def test_a_marker_of_several_tokens_already_begun_is_finished_not_repeated():
    b = budget(end=(6, 7), n=2)()  # the prompt opened the section
    b.commit([1, 6])  # the budget runs out right after the marker's first token
    assert b.forced() == [7]
    rows = b.allowed([7, 3])
    assert rows[0].sum() == 1 and rows[0][7] and rows[1:].all()


def test_a_budget_for_a_real_template_knows_whether_the_prompt_opened_thinking(tmp_path):
    """for_prompt reads the tokenizer's markers and whether the prompt ends inside a section
    (a template that starts the reply with <think> opens it)."""
    import tiny_tools as tt

    from dflash2_mlx.errors import ParameterError
    from dflash2_mlx.text import chat_prompt_ids

    tok = tt.load_tokenizer(tt.save_tokenizer(tmp_path / "tok"))
    start, end = tuple(tok.think_start_tokens), tuple(tok.think_end_tokens)
    vocab = len(tt.vocabulary())
    ids = chat_prompt_ids(tok, tt.HI)
    b = ThinkingBudget.for_prompt(tok, ids, 2, vocab)()
    assert b.start == start and b.end == end and not b.state.inside  # the model opens it
    b.commit(list(start) + [9, 9])
    assert b.forced() == list(end)
    opened = ThinkingBudget.for_prompt(tok, ids + list(start), 1, vocab)()
    assert opened.state.inside
    opened.commit([9])
    assert opened.forced() == list(end)

    class Plain:
        think_start_tokens = think_end_tokens = None

    with pytest.raises(ParameterError, match="no thinking section"):
        ThinkingBudget.for_prompt(Plain(), ids, 2, vocab)
