"""Each chapter's drawings and tables, one module per notebook, all in the one style of ``style.py``.

A notebook calls one function per figure; the drawing code lives here, where it is tested like the rest."""
