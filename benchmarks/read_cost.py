"""Benchmark: the cost of one socket read in the load client's hot path, the old way against the
new (issue 22, stop 28). One loopback TCP connection with kernel receive stamps on
(SO_TIMESTAMPNS), a 180-byte message sent and then read, `--reads` times per way and repeat:

- `recvmsg(256 KiB)`: what `benchkit.measure.httpstream` did before; Python allocates the whole
  size for every read and shrinks it to what came;
- `recvmsg_into` a buffer allocated once, then the bytes copied out: what it does now.

Prints us per read (the best of `--repeats`) and the ratio. A benchmark, not a test; exits 0.

    .venv/bin/python benchmarks/read_cost.py
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
READ_SIZE = 256 * 1024


def main(argv: list[str] | None = None) -> int:
    """Measure both ways; print their us per read and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    cli = socket.create_connection(lsock.getsockname())
    srv, _ = lsock.accept()
    cli.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cli.setblocking(False)
    anc = socket.CMSG_SPACE(16)
    view = [memoryview(bytearray(READ_SIZE))]
    msg = b"x" * 180
    garbage: list[bytes] = []

    def old() -> bytes:
        return cli.recvmsg(READ_SIZE, anc)[0]

    def new() -> bytes:
        n = cli.recvmsg_into(view, anc)[0]
        return bytes(view[0][:n])

    best = {}
    for _ in range(args.repeats):
        for name, read in (("recvmsg(256 KiB)", old), ("recvmsg_into + copy", new)):
            total = 0
            for _ in range(args.reads):
                srv.send(msg)
                garbage.append(bytes(100))  # other allocations between reads, as in a real client
                if len(garbage) > 500:
                    garbage.clear()
                t0 = time.perf_counter_ns()
                got = read()
                total += time.perf_counter_ns() - t0
                assert got == msg, "a read did not return the whole message"
            best[name] = min(best.get(name, float("inf")), total / args.reads / 1000)
    for name, us in best.items():
        print(f"{name:22s} {us:6.2f} us per read (best of {args.repeats} x {args.reads})")
    print(f"ratio old / new: {best['recvmsg(256 KiB)'] / best['recvmsg_into + copy']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
