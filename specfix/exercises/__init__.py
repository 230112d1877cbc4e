"""Exercises with checkers, one module per chapter; reference solutions in ``solutions/``.

A checker never raises: it says what is still missing, names each typical mistake with its own hint, and
says plainly when the answer is right. ``core.use_solutions(True)`` makes every checker check the reference
solution instead of the reader's answer (how the suite proves that its exercises can be solved)."""
