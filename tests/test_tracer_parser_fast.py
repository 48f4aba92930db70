"""The parser's grammar-free path for the common word 0 gives the head the grammar gives."""

import pytest

from kprobefs.tracing.events.probe_parser import _SIMPLE_WORD0, _Word0, _parse, _parse_word0

WORDS = ["p", "r", "p:ev", "r:ev", "p:grp/ev", "r:g_1/e_2", "p:_a", "p:a1/_b9",
         "p:" + "x" * 70, "r:" + "g" * 40 + "/" + "e" * 40]


@pytest.mark.parametrize("word", WORDS)
def test_simple_word0_matches_the_grammar(word):
    assert _SIMPLE_WORD0.fullmatch(word)
    assert _parse_word0(word) == _parse("word0", word, _Word0())


@pytest.mark.parametrize("word", ["p10:ev", "r5", "p:grp.x/ev", "p:1ev", "p:", "p:g/",
                                  "p:/ev", "p:a-b", "r:g/e/f"])
def test_other_words_take_the_grammar(word):
    assert not _SIMPLE_WORD0.fullmatch(word)
