"""Model Runner V2 parts, mirroring ``vllm/v1/worker/gpu/``: the draft-model speculator and its persistent
buffers, CUDA-graph dispatch, DFlash input preparation, the Triton Gumbel sampler (chapters 3 and 4) and the
draft slots that keep placeholders from the embedding (chapter 1)."""
