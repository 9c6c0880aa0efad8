"""What checking a host copy costs: keyed BLAKE3 (format 3, ``nvtrain.worker.hostcopy``) against
the unkeyed xxh3 of 64 MiB pieces it replaced (format 2), over buffers in memory.

    python benchmarks/hostcopy_mac.py                 # 1 GiB and 4 GiB, 5 runs each
    python benchmarks/hostcopy_mac.py --sizes 1 --runs 3

Prints the median GB/s (10^9 bytes per second) of each, side by side, and the seconds for the
buffer. Both hash on every core (blake3's own threads; xxh3 on up to 8 threads, as format 2 did).
The buffer is an anonymous memory map filled with random bytes, touched before timing, as the
slot files in /dev/shm are.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import mmap
import os
import statistics
import time
from collections.abc import Callable

PIECE = 64 << 20
THREADS = 8


def xxh3_pieces(data: memoryview) -> str:
    """Format 2's hash: xxh3 of the xxh3 digests of the 64 MiB pieces, on up to 8 threads."""
    import xxhash

    pieces = [data[i : i + PIECE] for i in range(0, len(data), PIECE)]
    with concurrent.futures.ThreadPoolExecutor(min(len(pieces), THREADS)) as pool:
        digests = list(pool.map(xxhash.xxh3_64_digest, pieces))
    return xxhash.xxh3_64_hexdigest(b"".join(digests))


def keyed_blake3(key: bytes) -> Callable[[memoryview], str]:
    import blake3

    def run(data: memoryview) -> str:
        return blake3.blake3(data, key=key, max_threads=blake3.blake3.AUTO).hexdigest()

    return run


def buffer(nbytes: int) -> mmap.mmap:
    buf = mmap.mmap(-1, nbytes)
    chunk = os.urandom(16 << 20)
    for start in range(0, nbytes, len(chunk)):
        buf[start : start + len(chunk)] = chunk[: nbytes - start]
    return buf


def median_rate(fn: Callable[[memoryview], str], data: memoryview, runs: int) -> tuple[float, float]:
    """(median GB/s, median seconds) of ``runs`` runs after one warm-up."""
    fn(data)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(data)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return len(data) / seconds / 1e9, seconds


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4], help="GiB per buffer")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    blake = keyed_blake3(os.urandom(32))
    print(f"cores: {os.cpu_count()}; median of {args.runs} runs")
    print(f"{'size':>6} {'xxh3 (format 2)':>22} {'keyed BLAKE3 (format 3)':>26}")
    for gib in args.sizes:
        buf = buffer(gib << 30)
        view = memoryview(buf)
        old, old_s = median_rate(xxh3_pieces, view, args.runs)
        new, new_s = median_rate(blake, view, args.runs)
        print(f"{gib:>4}GiB {old:>9.2f} GB/s {old_s:>7.3f} s {new:>12.2f} GB/s {new_s:>7.3f} s")
        view.release()
        buf.close()


if __name__ == "__main__":
    main()
