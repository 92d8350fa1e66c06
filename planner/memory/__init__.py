"""Per-GPU memory of a step: the seed profile (the documents' rules), the detailed profile (saved tensors,
states, buffers, allocator) and the estimate that compares them with a card's capacity."""
