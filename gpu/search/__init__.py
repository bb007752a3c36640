"""Exact string search (Rabin-Karp, KMP, Boyer-Moore) over large texts: parameters, the NumPy/Python reference, the CUDA kernels."""
