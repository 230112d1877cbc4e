"""Exercises with checkers, one module per chapter (``core`` first), and their reference ``solutions``.

A checker never raises: it names each typical mistake with its own hint and says plainly when the answer is
right. ``core.use_solutions(True)`` checks the reference solutions instead (how the suite proves them
solvable)."""
