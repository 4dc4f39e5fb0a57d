"""``python -m bench.citus start|stop``: a Citus cluster on this machine, for the suites'
Citus mode and the drive (``python -m bench.citus drive``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench.citus.cluster import CitusCluster, ClusterError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.citus", description=__doc__)
    parser.add_argument("action", choices=("start", "stop", "drive"))
    parser.add_argument(
        "--port", type=int, default=9700, help="the coordinator's port (default 9700)"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker nodes (default 2)")
    args, rest = parser.parse_known_args(argv)
    cluster = CitusCluster(port=args.port, workers=args.workers)
    try:
        if args.action == "start":
            cluster.start()
            print(f"export PIKKU_TEST_CITUS_URL={cluster.url()}")
        elif args.action == "stop":
            cluster.stop()
        else:
            from bench.citus.drive import drive

            return drive(cluster, rest)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
