"""Exercises with checkers, one module per chapter (read ``core`` first), and their reference solutions."""
