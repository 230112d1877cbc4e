"""The V1 engine in miniature, mirroring ``vllm/v1/``: scheduler, input batch, model runner, metadata,
rejection sampler, drafters and the engine loop. Chapter 1 follows a ``-1`` placeholder through it."""
