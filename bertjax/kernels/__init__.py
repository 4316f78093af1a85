"""Fused kernels the model can use: Pallas attention (GPU) with hash dropout, TPU splash attention, hash dropout."""
