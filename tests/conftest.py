"""Package tests draw figures off-screen; notebooks keep their inline backend."""

import matplotlib

matplotlib.use("Agg")

import specfix  # noqa: E402,F401  (switches on Triton's interpreter before any test imports triton)
