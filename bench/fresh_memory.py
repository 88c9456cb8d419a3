"""What it costs this host to hand a process memory it has not touched lately.

Every benchmark here starts a fresh daemon per round (and the PyTorch comparison fresh loader workers), so each
round first-touches its whole footprint. On a bare-metal host or a fully backed VM that is the kernel zeroing
pages, tens of milliseconds per GiB. On a VM whose host reclaims the guest's free memory (free page reporting,
a balloon) and backs it again only when it is touched, the same touch can cost twenty times more, and how much
depends on whether the pages handed out were reported since their last use: a source of run-to-run spread
that no client controls. This prints the cost three ways: memory the host has not backed lately, the same
memory touched again at once, and again after an idle pause. `--small-pages` asks for 4 KiB pages instead of
huge ones (a host that takes memory back in 2 MiB blocks charges a huge page's first touch the most).

    python3 bench/fresh_memory.py [--mib 512] [--idle-s 15] [--small-pages]
"""

import argparse
import mmap
import time

PAGE = 4096


def touch(mib, huge):
    """Seconds to write one byte into each 4 KiB page of `mib` MiB of fresh anonymous memory, then free it."""
    size = mib << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        advice = "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE"  # huge: as the daemon's big buffers ask
        if hasattr(mmap, advice):
            m.madvise(getattr(mmap, advice))
        started = time.perf_counter()
        for offset in range(0, size, PAGE):
            m[offset] = 1
        return time.perf_counter() - started
    finally:
        m.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="memory touched per measurement")
    ap.add_argument("--idle-s", type=float, default=15.0, help="pause before the first and the last measurement")
    ap.add_argument("--small-pages", action="store_true", help="4 KiB pages instead of transparent huge pages")
    args = ap.parse_args()

    time.sleep(args.idle_s)
    huge = not args.small_pages
    rows = [("after an idle pause", touch(args.mib, huge)), ("again at once", touch(args.mib, huge))]
    time.sleep(args.idle_s)
    rows.append((f"again after {args.idle_s:g} s idle", touch(args.mib, huge)))
    pages = "huge pages" if huge else "4 KiB pages"
    for label, secs in rows:
        print(f"{args.mib} MiB of fresh memory ({pages}), {label}: {secs:.3f} s, {secs * 1000 / args.mib:.2f} ms per MiB")


if __name__ == "__main__":
    main()
