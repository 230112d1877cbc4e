"""One switch per fix, all on by default, so every bug can be re-created on demand.

    from specfix import Fixes
    Fixes()                                  # everything fixed
    Fixes(clamp_placeholders=False)          # re-create chapter 2's device-side assert
    Fixes.all_off()                          # the code as it was before every fix
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Fixes:
    #: vLLM PR #47029: ``_preprocess`` clamps ``input_ids`` to >= 0 before the embedding (chapters 1, 2).
    clamp_placeholders: bool = True
    #: vLLM PR #46533: the rejection sampler rejects any draft id < 0, in every mode (chapter 1).
    reject_negative_drafts: bool = True
    #: vLLM PR #47066: ``gumbel_block_argmax`` masks loads and the processed-logits store by
    #: ``req_state_idx >= 0`` (chapters 3, 4).
    mask_invalid_reqs: bool = True
    #: vLLM PR #47066: ``_copy_request_inputs`` fills ``idx_mapping[num_reqs:]`` with -1 (chapter 3).
    pad_idx_mapping: bool = True
    #: vLLM PR #47066: DFlash input preparation pads ``sample_idx_mapping`` with -1, not 0 (chapter 3).
    dflash_pad_idx: bool = True

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def all_off(cls) -> Fixes:
        return cls(**{name: False for name in cls.names()})

    def without(self, *names: str) -> Fixes:
        """A copy with the named fixes switched off."""
        unknown = sorted(set(names) - set(self.names()))
        if unknown:
            raise ValueError(f"unknown fix name(s) {unknown}; known: {self.names()}")
        return dataclasses.replace(self, **{name: False for name in names})
