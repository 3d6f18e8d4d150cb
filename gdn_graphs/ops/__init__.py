"""GDN kernels (Triton) and the plain PyTorch reference they are tested against."""
