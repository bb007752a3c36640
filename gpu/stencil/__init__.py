"""3D acoustic wave propagation with a 13-point stencil (Pavan et al. 2018): parameters,
the NumPy reference (also the CPU backend), nine CUDA kernel variants and NVML energy."""
