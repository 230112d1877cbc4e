"""Reference solutions, one module per chapter. Try each exercise first."""
