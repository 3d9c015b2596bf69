"""GPU ceilings measured in the same run as the benchmarks: bf16 matmul TFLOP/s and copy GB/s.

python bench/gpu/ceilings.py --out results/ceilings.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def _time_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median wall time of ``fn`` in ms, measured with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def matmul_tflops(n: int = 8192, iters: int = 20) -> float:
    """Dense bf16 ``n×n @ n×n`` (fp32 accumulate): the peak a trainer's MFU is measured against."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _time_ms(lambda: a @ b, iters)
    return 2 * n**3 / (ms / 1e3) / 1e12


def copy_gbps(gib: float = 4.0, iters: int = 20) -> dict[str, float]:
    """Device-to-device ``copy_`` of ``gib`` GiB: bytes copied per second (each byte is read and
    written once, so DRAM traffic is twice this)."""
    n = int(gib * (1 << 30))
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src), iters)
    copied = n / (ms / 1e3) / 1e9
    return {"copy_GBps": copied, "dram_traffic_GBps": 2 * copied}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "bf16_matmul_TFLOPs": matmul_tflops(),
        **copy_gbps(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
