#!/usr/bin/env python3
"""What the Rust mirror (crates/client) costs and how far behind it runs, at scale.

    python3 benches/rust_mirror.py                # 1M accounts (built once, cached)
    python3 benches/rust_mirror.py --accounts 100000 --changes 100

The server runs on a copy of load.py's cached SQLite database (release, pinned to CPU 0);
the mirror (`cargo run --release -p keyspread-client --example mirror_bench`, built first)
runs on CPU 1 and prints: the time from start to a ready mirror (the whole snapshot read and
indexed), in-process lookups per second on one thread, and commit-to-mirror latency p50 and
p99 on this one server. Goals (issue "the mirror"): >= 10 million lookups/s, <= 3 s to a
ready mirror at a million accounts, <= 100 ms p99 on one server.
"""

import argparse
import os
import subprocess

import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args):
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "keyspread-client",
                    "--example", "mirror_bench"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    bench = os.path.join(target, "release", "examples", "mirror_bench")
    server = load.serve_copy(args)
    head = (f"The Rust mirror, {args.accounts} accounts (SQLite, release, server on CPU "
            f"{load.SERVER_CPU}, mirror on CPU {load.CLIENT_CPU}), load average "
            f"{os.getloadavg()[0]:.2f}:")
    out = subprocess.run(
        [bench, "--url", f"http://127.0.0.1:{server.port}", "--changes", str(args.changes)],
        capture_output=True, text=True, timeout=600)
    server.stop()
    if out.returncode != 0:
        raise SystemExit(f"mirror_bench failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    return head + "\n" + "\n".join(f"- {line}" for line in out.stdout.splitlines())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    load.database_script_arguments(parser, hot_every=1000)
    parser.add_argument("--changes", type=int, default=200)
    args = parser.parse_args()
    load.run_database_script(args, run)


if __name__ == "__main__":
    main()
