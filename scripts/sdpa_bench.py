#!/usr/bin/env python3
"""PyTorch SDPA on the shapes of `sieve bench kernels` (the side-by-side reference of PERF.md).

Causal attention, 32 query heads / 8 KV heads (GQA), bf16: head dim 128 at 4k and 16k tokens and
head dim 64 at 4k, for each SDPA backend that runs. FLOPs counted as FlashAttention does for causal:
4 * batch * heads * n^2 * d / 2. Prints JSON on stdout.
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, warmup=5, iters=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    results = []
    heads, kv_heads = 32, 8
    for n, batch, d in ((4096, 4, 128), (16384, 1, 128), (4096, 4, 64)):
        q = torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, kv_heads, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, kv_heads, n, d, device="cuda", dtype=torch.bfloat16)
        flops = 4 * batch * heads * n * n * d / 2
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ms = time_ms(lambda: F.scaled_dot_product_attention(
                        q, k, v, is_causal=True, enable_gqa=True))
                results.append({"backend": name, "n": n, "batch": batch, "d": d, "ms": ms,
                                "tflops": flops / ms / 1e9})
            except Exception as error:  # a backend that does not support the shape
                results.append({"backend": name, "n": n, "batch": batch, "d": d,
                                "error": str(error)[:200]})
    json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
               "results": results}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
