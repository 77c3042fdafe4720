"""torch's global numeric switches for one run, set at its start and put back at its end.

The jobs of a sweep can share a process (the basic launcher runs them in turn), so a
setting of one job must not leak into the next. TF32 matmuls and convolutions (`tf32`,
off by default) trade precision for speed on Ampere and later GPUs; they stay off under
`deterministic`, which also asks for deterministic kernels and the cuBLAS workspace
setting they need, overriding a value of the user's that would make the first matmul
fail. cuDNN's benchmark mode stays off: it picks kernels by timing them, so a run and its
resume could pick differently.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

CUBLAS = "CUBLAS_WORKSPACE_CONFIG"


@contextmanager
def numerics(deterministic: bool, tf32: bool):
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, os.environ.get(CUBLAS))
    fast = tf32 and not deterministic
    torch.backends.cuda.matmul.allow_tf32 = fast
    torch.backends.cudnn.allow_tf32 = fast
    torch.backends.cudnn.benchmark = False
    if deterministic:
        os.environ[CUBLAS] = ":4096:8"
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        was_deterministic, benchmark, matmul_tf32, cudnn_tf32, cublas = saved
        if torch.are_deterministic_algorithms_enabled() != was_deterministic:  # the call imports torch's compiler
            torch.use_deterministic_algorithms(was_deterministic)                # stack: ~3 s, at every run's end
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        if cublas is None:
            os.environ.pop(CUBLAS, None)
        else:
            os.environ[CUBLAS] = cublas
