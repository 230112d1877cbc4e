"""A word-level tokenizer over the fables shipped in ``specfix/data/fables.txt``.

Stands in for the Hugging Face tokenizer vLLM loads (in vLLM 0.33.0, ``get_tokenizer`` of
``vllm/tokenizers/registry.py``, wrapping ``AutoTokenizer`` in ``vllm/tokenizers/hf.py``), so a reader sees
a corrupted output (a repeated or missing word) with their own eyes.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# Two ids meet placeholders, so they are chosen on purpose. Token 0 is ``"the"``, the commonest word: a
# placeholder zeroed into token 0 is accepted whenever the target would say "the". The last id is ``"."``:
# before vLLM PR #46533 a ``-1`` draft read the previous row's P(id V-1), so a placeholder was accepted
# about as often as the target would end a sentence.
TOKEN_ZERO = "the"
UNK = "<unk>"
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[.,!?:;]")
_NO_SPACE_BEFORE = {".", ",", "!", "?", ":", ";"}
_SENTENCE_END = {".", "!", "?"}


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks, in order."""
    return _WORD.findall(text.lower())


class Tokenizer:
    """Words to ids and back: 0 is ``"the"``, then words, ``"<unk>"``, punctuation; ``V - 1`` is ``"."``."""

    def __init__(self, vocab: Sequence[str]):
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab has duplicate words")
        self.vocab = list(vocab)
        self.token_to_id = {w: i for i, w in enumerate(self.vocab)}
        self.unk_token_id = self.token_to_id[UNK]

    @classmethod
    def from_text(cls, text: str) -> Tokenizer:
        counts = Counter(words(text))
        if TOKEN_ZERO not in counts:
            raise ValueError(f"the corpus must contain {TOKEN_ZERO!r}, which becomes token 0")
        by_frequency = sorted(counts, key=lambda w: (-counts[w], w))
        words_ = [w for w in by_frequency if w != TOKEN_ZERO and w[0].isalpha()]
        marks = [w for w in reversed(by_frequency) if not w[0].isalpha()]
        return cls([TOKEN_ZERO, *words_, UNK, *marks])

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        return [self.token_to_id.get(w, self.unk_token_id) for w in words(text)]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Readable text. An id outside ``[0, vocab_size)`` (a leaked ``-1``, say) shows as ``<-1>``."""
        out: list[str] = []
        capitalise = True
        for raw in token_ids:
            tid = int(raw)
            if not 0 <= tid < self.vocab_size:
                piece = f"<{tid}>"
            else:
                piece = self.vocab[tid]
                if capitalise or piece == "i":
                    piece = piece[0].upper() + piece[1:]
            if out and piece not in _NO_SPACE_BEFORE:
                out.append(" ")
            out.append(piece)
            capitalise = piece in _SENTENCE_END
        return "".join(out)


@functools.lru_cache(maxsize=1)
def corpus_text() -> str:
    return (Path(__file__).with_name("data") / "fables.txt").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> Tokenizer:
    """The one tokenizer every chapter uses (built from the fables, cached)."""
    return Tokenizer.from_text(corpus_text())
