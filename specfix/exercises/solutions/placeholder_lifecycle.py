"""Reference solutions of chapter 1's exercises (``specfix.exercises.placeholder_lifecycle``)."""

import torch


def gather_draft_token_ids(input_ids, logits_indices, target_logits_indices):
    # Logits row j is computed at position logits_indices[j] and predicts the token after it: the draft it
    # verifies is the token of the next row. An index with a tensor gathers into a new tensor: a copy, so
    # the clamp that _preprocess applies to input_ids in place later leaves its -1s alone.
    return input_ids[logits_indices.long()][target_logits_indices.long() + 1]


def metadata_answer():
    return {
        # One entry per request in batch order; a -1 slot is a draft slot like any other, the prefill has 0.
        "num_draft_tokens": [3, 0, 3, 3],
        # Inclusive running sum, no leading 0: request i's drafts end at cu[i].
        "cu_num_draft_tokens": [3, 3, 6, 9],
        # draft_token_ids = [17, 4, 9, -1, -1, -1, 13, -1, -1]: a's three, c's three, d's three.
        "placeholder_indices": [3, 4, 5, 7, 8],
    }


zero_accepts = 2  # r0 and r2 continue with 'the': slot 1 (token 0) is accepted, slot 2 ('the' again) is not


def accept_drafts(draft_ids, target_probs, draft_probs, uniforms):
    real = draft_ids >= 0
    column = torch.where(real, draft_ids, 0).unsqueeze(1)  # never index with -1: read column 0 instead
    p = target_probs.gather(1, column).squeeze(1)
    q = draft_probs.gather(1, column).squeeze(1)
    ratio = p / torch.where(q > 0, q, 1.0)  # no division by 0; q == 0 is rejected below
    return real & (q > 0) & (ratio.double() >= uniforms)  # a negative draft is rejected, whatever p and q say


def emitted_tokens(drafts, choices):
    emitted = []
    for draft, choice in zip(drafts, choices[: len(drafts)], strict=True):  # the last choice: the bonus
        emitted.append(choice)  # the target's token: the draft itself when they agree
        if draft != choice:  # a -1 never equals a token id: a placeholder is always rejected
            return emitted
    return emitted + [choices[len(drafts)]]  # every draft accepted: the bonus token


clamp_point = {
    "scheduler": 0,  # the 0 is in the request's draft list: every later copy carries it
    "before_metadata": 0,  # draft_token_ids is gathered from input_ids after the clamp
    "preprocess": -1,  # draft_token_ids was gathered before: a separate tensor keeps the -1
}
