"""Sparse weights: the patterns a weight's live places are drawn from (``sparsity``) and
the tile encoding MemoryX streams and the kernels read (``tiles``)."""
