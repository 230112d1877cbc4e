"""The chapters' experiments, built around the mirrors: the embedding assert re-created in a child process,
the placeholder fixes compared, the padded-batch reproduction, the padding-invariance checker and the
index guard. None of these exist in vLLM."""
