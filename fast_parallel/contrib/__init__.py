"""Fixes beside the fast path: the KITTI metric on CPU, the numpy-1.24 db
sampler."""
