"""CS256 compressed sparse tiles (Lasby, Zimmer, Pokutta & Schultheis): the format, its
conversions and files, the NumPy product (reference.py) and the CUDA SpMV/SpMM (cuda.py)."""
