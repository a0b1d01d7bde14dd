"""Next-token choice for a whole step (`sampler`): penalties, bias, the grammar mask, logprobs and
the draw, as batched tensor ops. May import `core` (the sequences it samples for)."""
