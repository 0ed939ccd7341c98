#!/usr/bin/env python3
"""Proof on kinesalite that keyspread's closed loop balances what a stream really carries.

`run` makes one run on a fresh 8-shard stream: examples/load_generator.py writes 300 accounts
with Zipf(1.1) record rates through the order-safe producer, the hot accounts rotating at
the midpoint; 4 lease workers (examples/lease_worker.py, in threads of this process) read
the stream and hand every batch to the order-aware consumer's logic
(examples/order_aware_consumer.py), which keeps each account in order across keyspread's
moves. The fleet is up (every worker joined, every shard held) before the generator starts,
as a consumer fleet is before its producers write. Schemes:

- `md5`: no ExplicitHashKey, Kinesis places each account by the MD5 of its name;
- `plain`: keyspread's keys (accounts allocated by count, nobody's load known), no reports;
- `loop`: the same keys, accounts opted in to 4 keys (`max_fanout`), the workers report
  what they read with their heartbeats and the server runs its controller.

From what the consumers handed on it counts, per 10-s window from the generator's start
(by the records' arrival), the busiest shard's records over the mean, and the busiest
worker's over the mean; per (account, sub-key), records out of order, twice or never; and
from `GET /events`, the load moves by round and any account moved twice within the
cooldown. A window's shards are judged once it starts `--settle-s` after the start and
after the rotation, its workers `--worker-settle-s` after them: the leases follow the
shards' load as the workers report it, smoothed, so they settle later. Prints a line per window, then the figures as one JSON line (also to `--out`).

`plot` draws the runs' figures as one SVG (standard library only): busiest shard over the
mean, per window, for each run.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

from order_check import check_order

WINDOW = 10
SHARDS = 8
WORKERS = 4
MAX_FANOUT = 4
WEIGHT = 12  # the same for every account: divisible by every fanout up to 4


def kinesis_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "kinesis", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=10),
    )


class Keyspread:
    """The few calls the harness makes itself, as plain JSON."""

    def __init__(self, client):
        self.http = client.get_httpx_client()

    def call(self, method, path, body=None, ok=(200, 201, 204)):
        response = self.http.request(method, path, json=body)
        if response.status_code not in ok:
            raise SystemExit(f"{method} {path} answered {response.status_code}: {response.text}")
        return response.json() if response.content else None

    def events(self):
        out, after = [], 0
        while True:
            page = self.call("GET", f"/events?after={after}&limit=1000")
            out += page["events"]
            if len(page["events"]) < 1000:
                return out
            after = page["next"]


class Gate:
    """The order-aware consumer's logic shared by the readers: one lock around it, and the
    moves learnt twice a second."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.learner = threading.Thread(target=self.learn, daemon=True)
        self.learner.start()

    def take(self, shard, answer, started, **extra):
        with self.lock:
            self.consumer.take(shard, answer, started, **extra)

    def learn(self):
        import httpx

        while not self.stop.wait(0.5):
            with self.lock:
                try:
                    self.consumer.learn_moves()
                except (httpx.HTTPError, RuntimeError):
                    pass  # keyspread restarting: its moves are learnt at the next look
                self.consumer.release()

    def held(self):
        with self.lock:
            return sum(len(r) for r in self.consumer.held.values())

    def follow(self, listed):
        with self.lock:
            self.consumer.follow(listed)


def prepare(args, keyspread, kinesis):
    kinesis.create_stream(StreamName=args.stream, ShardCount=SHARDS)
    for _ in range(200):
        summary = kinesis.describe_stream_summary(StreamName=args.stream)["StreamDescriptionSummary"]
        if summary["StreamStatus"] == "ACTIVE":
            break
        time.sleep(0.05)
    keyspread.call("PUT", f"/streams/{args.stream}", {"shard_count": SHARDS, "primary": True})
    if args.scheme == "md5":
        return
    from load_generator import account_names

    accounts = account_names(args.accounts)
    keyspread.call("POST", "/keys/batch", {"accounts": [{"account": a, "weight": WEIGHT} for a in accounts]})
    if args.scheme == "loop":
        for account in accounts:
            keyspread.call("PATCH", f"/keys/{account}", {"max_fanout": MAX_FANOUT})


def generate(args):
    """Runs the load generator as its own process; answers its figures."""
    command = [sys.executable, os.path.join(args.examples, "load_generator.py"), "--stream", args.stream,
               "--endpoint-url", args.kinesis, "--seconds", str(args.seconds), "--accounts", str(args.accounts),
               "--rate", str(args.rate), "--seed", str(args.seed)]
    command += ["--md5"] if args.scheme == "md5" else ["--keyspread", args.keyspread]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([args.client_dir, args.examples]),
               AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.seconds + 120)
    if done.returncode != 0:
        raise SystemExit(f"load_generator.py exited {done.returncode}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def settled(keyspread, stream, timeout=60):
    """Waits until the fleet is up, as a consumer fleet is before its producers write: every
    worker joined, every shard held, nothing being handed over, the same for a second."""
    deadline, last = time.time() + timeout, None
    while True:
        group = keyspread.call("GET", f"/streams/{stream}/leases")
        owners = {s["shard_id"]: s["owner"] for s in group["shards"]}
        steady = (len(group["workers"]) == WORKERS and all(owners.values())
                  and all(s["state"] == "held" for s in group["shards"]))
        if steady and owners == last:
            return
        last = owners if steady else None
        if time.time() > deadline:
            raise SystemExit(f"the workers did not settle in {timeout} s: {group}")
        time.sleep(1)


def ratios(counts, names):
    values = [counts.get(n, 0) for n in names]
    mean = sum(values) / len(values)
    return round(max(values) / mean, 3) if mean else None


def windows(handed, produced, shard_ids, workers, settle_s, worker_settle_s):
    """Per full window: records per shard and per worker, their max / mean, and whether each
    is judged: shards `settle_s` after the start and after the rotation, workers
    `worker_settle_s` after them (the leases follow the shards' smoothed load)."""
    start, rotated, end = produced["started"], produced["rotated_at"], produced["started"] + produced["seconds"]

    def judged(t, settle):
        after_rotation = rotated is not None and start + t >= rotated
        return t >= settle and (not after_rotation or start + t >= rotated + settle) \
            and (after_rotation or rotated is None or start + t + WINDOW <= rotated)

    by_window = collections.defaultdict(lambda: (collections.Counter(), collections.Counter(),
                                                 collections.defaultdict(set)))
    for r in handed:
        i = int((r["arrival"] - start) // WINDOW)
        by_window[i][0][r["shard"]] += 1
        by_window[i][1][r["worker"]] += 1
        by_window[i][2][r["worker"]].add(shard_ids.index(r["shard"]))
    out = []
    for i in range(int((end - start) // WINDOW)):
        shards, by_worker, read_by = by_window[i]
        t = i * WINDOW
        out.append({"t": t, "records": sum(shards.values()), "shard": ratios(shards, shard_ids),
                    "worker": ratios(by_worker, workers), "judged": judged(t, settle_s),
                    "workers_judged": judged(t, worker_settle_s),
                    "per_shard": [shards.get(s, 0) for s in shard_ids],
                    "per_worker": [by_worker.get(w, 0) for w in workers],
                    "shards_read": [sorted(read_by.get(w, ())) for w in workers]})
    return out


def order(handed, produced):
    numbered = {((a, s), n) for a, s, count in produced["numbered"] for n in range(count)}
    return check_order(handed, numbered)


def moves(events, cooldown_s):
    """Load moves by round (one apply: one `switch_at`), and accounts moved twice within the cooldown."""
    from datetime import datetime

    def seconds(stamp):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    load = [e for e in events if e["kind"] == "move" and e.get("reason") == "load"]
    rounds = collections.Counter(e["switch_at"] for e in load)
    moved = collections.defaultdict(list)
    for e in load:
        moved[e["account"]].append(seconds(e["at"]))
    twice = []
    for account, times in moved.items():
        times.sort()
        twice += [f"{account} moved {b - a:.1f} s apart" for a, b in zip(times, times[1:])
                  if b - a < cooldown_s and b != a]
    return {"moves": len(load), "moves_per_round": [rounds[k] for k in sorted(rounds)],
            "moved_accounts": len(moved), "moved_within_cooldown": twice,
            "all_moves": sum(1 for e in events if e["kind"] == "move")}


def run(args):
    sys.path.insert(0, args.client_dir)
    sys.path.insert(0, args.examples)
    from keyspread_api import Client
    from lease_worker import LeaseWorker
    from order_aware_consumer import OrderAwareConsumer

    client = Client(base_url=args.keyspread, timeout=30)
    keyspread = Keyspread(client)
    kinesis = kinesis_client(args.kinesis)
    prepare(args, keyspread, kinesis)

    handed = []
    consumer = OrderAwareConsumer(kinesis, args.stream, client, skew_ms=args.skew_ms,
                                  deliver=lambda shard, record: handed.append(record), read=False)
    gate = Gate(consumer)
    workers = [LeaseWorker(kinesis_client(args.kinesis), Client(base_url=args.keyspread, timeout=30),
                           args.stream, f"w{i}", args.worker_ttl_s, emit=lambda line: None,
                           report_load=args.scheme == "loop", consumer=gate, pause_s=0.2)
               for i in range(WORKERS)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    cpu_before = os.times()
    for t in threads:
        t.start()
    settled(keyspread, args.stream)
    produced = generate(args)
    produced["seconds"] = args.seconds
    # What keyspread made of the reports, while the load still runs at full rate.
    load = observed(keyspread, args.stream) if args.scheme == "loop" else None
    # Drain: every record handed on, nothing held back behind a move.
    deadline = time.time() + 60
    while time.time() < deadline and (len(handed) < produced["records"] or gate.held()):
        time.sleep(0.5)
    for w in workers:
        w.stopping = True
    for t in threads:
        t.join(timeout=30)
    gate.stop.set()
    cpu = os.times()
    shard_ids = sorted(consumer.shards.ids())
    events = keyspread.events()
    figures = {
        "scheme": args.scheme,
        "records": produced["records"],
        "handed_on": len(handed),
        "held_back": consumer.held_back,
        "most_queued": produced["most_queued"],
        "resent": produced["resent"],
        "seconds": args.seconds,
        "rotated_at_s": round(produced["rotated_at"] - produced["started"], 1) if produced["rotated_at"] else None,
        "windows": windows(handed, produced, shard_ids, [w.worker for w in workers], args.settle_s,
                           args.worker_settle_s),
        **order(handed, produced),
        **moves(events, args.cooldown_s),
        "hottest": hottest(keyspread, produced, args.scheme),
        "load": load,
        "harness_cpu_s": round(sum(cpu[:4]) - sum(cpu_before[:4]), 1),
    }
    for w in figures["windows"]:
        print(f"{args.scheme:>5} t={w['t']:>3}s records={w['records']:>5} busiest shard/mean={w['shard']}"
              f"{' (judged)' if w['judged'] else ''} "
              f"busiest worker/mean={w['worker']}{' (judged)' if w['workers_judged'] else ''} "
              f"per shard={w['per_shard']} per worker={w['per_worker']} shards read={w['shards_read']}",
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f)
    print(json.dumps(figures), flush=True)


def observed(keyspread, stream):
    """`GET /load` in brief: shards reported, their records/s summed, utilisation per
    record/s of the busiest (1 / the per-shard limit), and how many shards' figures come
    from each source (consumers' or producers' reports)."""
    load = keyspread.call("GET", f"/load?stream={urllib.parse.quote(stream)}")
    shards = load["shards"]
    busiest = max(shards, key=lambda s: s["records_per_s"])
    return {"shards": sum(1 for s in shards if s["records_per_s"] > 0),
            "records_per_s": round(sum(s["records_per_s"] for s in shards), 1),
            "utilisation_per_record_per_s": round(busiest["utilisation"] / busiest["records_per_s"], 4)
            if busiest["records_per_s"] else None,
            "max_over_mean": load.get("max_over_mean"),
            "sources": dict(collections.Counter(s["source"] for s in shards))}


def hottest(keyspread, produced, scheme):
    """The fanout of the five hottest accounts before and after the rotation, at the end."""
    if scheme == "md5":
        return {}
    names = produced["ranks_before"][:5] + produced["ranks_after"][:5]
    return {a: keyspread.call("GET", f"/keys/{urllib.parse.quote(a)}").get("fanout") for a in names}


COLOURS = {"md5": "#c0392b", "plain": "#e67e22", "loop": "#2471a3", "producers": "#2471a3"}
LABELS = {"md5": "MD5 of the account names", "plain": "keyspread without the loop", "loop": "keyspread with the loop",
          "producers": "keyspread, load reported by the producers"}


def plot(args):
    """An SVG of busiest shard / mean per window for each run, with the 1.15 bound."""
    runs = []
    for path in args.figures:
        with open(path) as f:
            runs.append(json.load(f))
    rotated = next((r["rotated_at_s"] for r in runs if r.get("rotated_at_s")), None)
    draw(runs, args.svg, "Busiest shard ÷ mean records per 10-s window (dashed: busiest of 4 workers)",
         "300 accounts at Zipf(1.1) rates, 8 shards on kinesalite",
         [(rotated, "hot accounts rotate")] if rotated else [])
    table(runs)


def draw(runs, svg, title, subtitle, marks):
    """Writes `svg` (standard library only): busiest shard / mean per window of each run (a
    line, and a dashed one for workers where the windows have them), the 1.15 bound, and a
    dotted line at each of `marks` (seconds, label)."""
    width, height, left, right, top, bottom = 760, 400, 60, 20, 50, 70
    seconds = max(r["seconds"] for r in runs)
    highest = max([w["shard"] or 0 for r in runs for w in r["windows"]] + [2.0])
    y_max = float(int(highest * 2 + 1)) / 2  # up to the next half

    def x(t):
        return left + (width - left - right) * t / seconds

    def y(v):  # max / mean is never below 1
        return height - bottom - (height - top - bottom) * (v - 1.0) / (y_max - 1.0)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14">{title}</text>',
             f'<text x="{width / 2}" y="34" text-anchor="middle" fill="#555">{subtitle}</text>']
    v = 1.0
    while v <= y_max + 1e-9:
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        v += 0.25
    for t in range(0, int(seconds) + 1, 10 if seconds <= 60 else 30):
        parts.append(f'<text x="{x(t):.1f}" y="{height - bottom + 16}" text-anchor="middle">{t} s</text>')
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(1.15):.1f}" y2="{y(1.15):.1f}" '
                 f'stroke="#27ae60" stroke-dasharray="6 4"/>')
    parts.append(f'<text x="{width - right}" y="{y(1.15) - 4:.1f}" text-anchor="end" fill="#27ae60">1.15</text>')
    for i, (at, label) in enumerate(marks):
        parts.append(f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{top}" y2="{height - bottom}" '
                     f'stroke="#888" stroke-dasharray="2 3"/>')
        parts.append(f'<text x="{x(at) + 4:.1f}" y="{top + 12 + 14 * i}" fill="#555">{label}</text>')
    for i, r in enumerate(runs):
        colour = COLOURS.get(r["scheme"], "#000")
        points = [(x(w["t"] + WINDOW / 2), y(w["shard"])) for w in r["windows"] if w["shard"] is not None]
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                     + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + '"/>')
        parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}"/>' for px, py in points]
        by_worker = [(x(w["t"] + WINDOW / 2), y(w["worker"])) for w in r["windows"] if w.get("worker") is not None]
        if by_worker:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="5 4" '
                         f'points="' + " ".join(f"{px:.1f},{py:.1f}" for px, py in by_worker) + '"/>')
        lx = left + i * 230
        parts.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{height - 22}" y2="{height - 22}" stroke="{colour}" '
                     f'stroke-width="2"/><text x="{lx + 30}" y="{height - 18}">{LABELS.get(r["scheme"], r["scheme"])}</text>')
    parts.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(svg)), exist_ok=True)
    with open(svg, "w") as f:
        f.write("\n".join(parts) + "\n")
    print(f"wrote {svg}")


def table(runs):
    """The runs side by side: busiest shard / mean (and busiest worker / mean) per window."""
    print("| window | " + " | ".join(LABELS.get(r["scheme"], r["scheme"]) for r in runs) + " |")
    print("| --- |" + " ---: |" * len(runs))
    for i, w in enumerate(runs[0]["windows"]):
        cells = []
        for r in runs:
            v = r["windows"][i] if i < len(r["windows"]) else None
            mark = "*" if v and v["judged"] else ""
            cells.append(f"{v['shard']} ({v['worker']}){mark}" if v else "")
        print(f"| {w['t']}-{w['t'] + WINDOW} s | " + " | ".join(cells) + " |")
    worst = [max((w["shard"] for w in r["windows"] if w["judged"]), default=None) for r in runs]
    print("| worst judged window | " + " | ".join(str(v) for v in worst) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="one run on a fresh stream")
    one.add_argument("--client-dir", required=True, help="holds the generated keyspread_api")
    one.add_argument("--keyspread", required=True)
    one.add_argument("--kinesis", required=True)
    one.add_argument("--stream", required=True)
    one.add_argument("--scheme", choices=["md5", "plain", "loop"], required=True)
    one.add_argument("--seconds", type=float, default=180)
    one.add_argument("--accounts", type=int, default=300)
    one.add_argument("--rate", type=float, default=160, help="records a second, all accounts")
    one.add_argument("--seed", type=int, default=1)
    one.add_argument("--skew-ms", type=int, default=1000)
    one.add_argument("--settle-s", type=float, default=33,
                     help="windows starting this long after the start or the rotation are judged")
    one.add_argument("--worker-ttl-s", type=int, default=6,
                     help="the lease workers' ttl: they heartbeat every third of it")
    one.add_argument("--worker-settle-s", type=float, default=57,
                     help="the same for the workers: the leases follow the shards' smoothed load")
    one.add_argument("--cooldown-s", type=float, default=600, help="the server's --move-cooldown-s")
    one.add_argument("--out", help="also write the figures here")
    draw = sub.add_parser("plot", help="the SVG of several runs")
    draw.add_argument("--svg", required=True)
    draw.add_argument("figures", nargs="+")
    args = parser.parse_args()
    args.examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    if args.command == "run":
        args.keyspread = args.keyspread.rstrip("/")
        run(args)
    else:
        plot(args)


if __name__ == "__main__":
    main()
