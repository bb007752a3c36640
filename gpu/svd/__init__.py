"""Singular value decomposition by Golub-Reinsch (Lahabar & Narayanan 2009): parameters and the NumPy reference."""
