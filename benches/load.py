#!/usr/bin/env python3
"""Load and start-up measurements of the keyspread server (Python 3 standard library only).

    python3 benches/load.py all                    # start-up, lookup, allocation (+ ceilings)
    python3 benches/load.py lookup --rounds 5 --duration 6
    python3 benches/load.py allocate --postgres postgres://postgres:postgres@127.0.0.1/postgres

The server runs pinned to CPU 0 and wrk to CPU 1 (taskset); every server listens on
127.0.0.1 on a free port and is stopped, with its temporary files, on exit or Ctrl-C.
Ratios are taken within one run: the machine may be shared and noisy. docs/BENCHMARKS.md
explains every figure.
"""

import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_DIR = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
SERVER_CPU, CLIENT_CPU = "0", "1"
CONNECTIONS = 64
BATCH_ROWS = 256

# Targets: (figure key, comparison, bound).
TARGETS = {
    "lookup_ratio": (">=", 0.85, "×"),
    "alloc_over_one": (">=", 5.0, "×"),
    "alloc_over_batched": (">=", 0.35, "×"),
    "startup_s": ("<=", 2.0, " s"),
    "rss_mb": ("<=", 300.0, " MB"),
}

_children = []  # every process this script started, stopped on exit
_tempdirs = []


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes and cleanup


def _on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cleanup():
    for proc in reversed(_children):
        stop(proc)
    for path in _tempdirs:
        shutil.rmtree(path, ignore_errors=True)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc in _children:
        _children.remove(proc)


def tempdir(parent=None):
    path = tempfile.mkdtemp(prefix="keyspread-bench-", dir=parent)
    _tempdirs.append(path)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(port, path, timeout=1.0):
    """Status of GET path, or None if the server does not answer yet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64).decode("latin-1")
        return int(head.split(" ", 2)[1]) if head.startswith("HTTP/") else None
    except (OSError, ValueError, IndexError):
        return None


class Server:
    """One keyspread server on a free loopback port, pinned to SERVER_CPU unless told not to."""

    def __init__(self, args, database_url, workdir, pinned=True, flags=()):
        self.port = free_port()
        cmd = ["taskset", "-c", SERVER_CPU] if pinned else []
        cmd += [args.binary, "serve",
               "--listen", f"127.0.0.1:{self.port}", "--database-url", database_url]
        cmd += serve_extra_flags(args.binary) + list(flags)
        self.log_path = os.path.join(workdir, f"server-{self.port}.log")
        env = dict(os.environ, RUST_LOG=os.environ.get("KEYSPREAD_BENCH_RUST_LOG", "warn"))
        self.started = time.monotonic()
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL)
        _children.append(self.proc)

    def wait_ready(self, timeout, poll=0.005):
        """Seconds from process start to /readyz answering 200."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited with {self.proc.returncode}; log:\n{self.tail()}")
            if http_status(self.port, "/readyz", timeout=0.5) == 200:
                return time.monotonic() - self.started
            time.sleep(poll)
        raise SystemExit(f"server not ready after {timeout} s; log:\n{self.tail()}")

    def memory_kib(self):
        status = open(f"/proc/{self.proc.pid}/status").read()
        field = lambda name: int(re.search(rf"^{name}:\s+(\d+) kB", status, re.M).group(1))
        return field("VmRSS"), field("VmHWM")

    def tail(self):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def stop(self):
        stop(self.proc)


_flags_cache = {}


def serve_extra_flags(binary):
    """Flags this server build understands that the benchmark wants set."""
    if binary not in _flags_cache:
        help_text = subprocess.run([binary, "serve", "--help"], capture_output=True,
                                   text=True, timeout=30).stdout
        # A per-client mutation rate limit would throttle the allocation test.
        _flags_cache[binary] = ["--mutation-rate", "0"] if "--mutation-rate" in help_text else []
    return _flags_cache[binary]


# ---------------------------------------------------------------- wrk


def check_tools():
    missing = [t for t in ("wrk", "taskset") if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: install with "
                         "`apt-get install -y wrk util-linux` (Debian/Ubuntu)")


LOOKUP_LUA = """
-- Same work for every route: one random account number formatted into the path.
local n = {accounts}
math.randomseed({seed})
request = function()
  return wrk.format("GET", string.format("{prefix}%07d", math.random(1, n)))
end
"""

ALLOCATE_LUA = """
-- A fresh account per request; counts statuses so non-201 answers are reported.
local i = 0
created, other = 0, 0  -- globals: done() reads them with thread:get
request = function()
  i = i + 1
  return wrk.format("POST", string.format("/keys/{prefix}-%09d", i))
end
response = function(status, headers, body)
  if status == 201 then created = created + 1 else other = other + 1 end
end
local threads = {{}}
setup = function(thread) table.insert(threads, thread) end
done = function(summary, latency, requests)
  local c, o = 0, 0
  for _, t in ipairs(threads) do c = c + t:get("created"); o = o + t:get("other") end
  io.write(string.format("STATUS created=%d other=%d\\n", c, o))
end
"""


def write_lua(workdir, name, text):
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def to_ms(value):
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", value)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    return float(m.group(1)) * scale


def wrk(port, script, seconds):
    cmd = ["taskset", "-c", CLIENT_CPU, "wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s",
           "--latency", "--timeout", "10s", "-s", script, f"http://127.0.0.1:{port}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    try:
        result = {
            "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "requests": int(re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", out).group(1)),
            "p50_ms": to_ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)),
            "p99_ms": to_ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)),
        }
        span = re.search(r"\d+ requests in ([\d.]+)(ms|s|m)", out)
        result["seconds"] = float(span.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[span.group(2)]
    except AttributeError:
        raise SystemExit(f"cannot read wrk's output:\n{out}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    errors = re.search(r"Socket errors: (.*)", out)
    result["socket_errors"] = errors.group(1).strip() if errors else "none"
    status = re.search(r"STATUS created=(\d+) other=(\d+)", out)
    if status:
        result["created"], result["other"] = int(status.group(1)), int(status.group(2))
    return result


# ---------------------------------------------------------------- the 1M-account database


def accounts_db(args):
    """A SQLite database with args.accounts accounts `acct-0000001`..., built once and cached.

    Every `args.hot_every`-th account is hot, with `args.hot_fanout` keys (weight as many):
    lookups of those answer all of their keys."""
    cache = os.path.join(
        args.cache_dir, f"accounts-{args.accounts}-hot-{args.hot_every}x{args.hot_fanout}")
    db, done = os.path.join(cache, "keyspread.db"), os.path.join(cache, "complete")
    if os.path.exists(done):
        return db
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache)
    csv_path = os.path.join(cache, "accounts.csv")
    with open(csv_path, "w") as f:
        f.write("account,weight,hash_key,fanout\n")
        k = args.hot_fanout
        f.writelines(f"acct-{i:07d},{k},,{k}\n" if args.hot_every and i % args.hot_every == 0
                     else f"acct-{i:07d},1\n" for i in range(1, args.accounts + 1))
    log(f"building the {args.accounts}-account database once (keyspread import), "
        f"cached in {cache} ...")
    started = time.monotonic()
    subprocess.run([args.binary, "import", csv_path, "--database-url", f"sqlite://{db}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=900)
    os.remove(csv_path)
    open(done, "w").write(f"import took {time.monotonic() - started:.1f} s\n")
    log(f"  import took {time.monotonic() - started:.1f} s")
    return db


# ---------------------------------------------------------------- measurements


def database_script_arguments(parser, hot_every):
    """The arguments of a script that serves a copy of accounts_db(): the server binary, the
    database's size and hot accounts (`hot_every` by default), its cache, the output file."""
    parser.add_argument("--binary", default=os.path.join(TARGET_DIR, "release", "keyspread"))
    parser.add_argument("--accounts", type=int, default=1_000_000)
    parser.add_argument("--hot-every", type=int, default=hot_every,
                        help="every Nth account is hot (0: none), as in load.py's database")
    parser.add_argument("--hot-fanout", type=int, default=16, help="keys of a hot account")
    parser.add_argument("--cache-dir", default=os.path.join(TARGET_DIR, "keyspread-bench"),
                        help="where load.py keeps the accounts database between runs")
    parser.add_argument("--output", help="also write the figures to this file")


def serve_copy(args, pinned=True):
    """A server on a fresh copy of accounts_db(), ready; this process moves to CLIENT_CPU
    when the server is pinned."""
    workdir = tempdir()
    cached = accounts_db(args)
    db = os.path.join(workdir, "keyspread.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(cached + suffix):
            shutil.copy(cached + suffix, db + suffix)
    server = Server(args, f"sqlite://{db}", workdir, pinned=pinned)
    if pinned:
        os.sched_setaffinity(0, {int(CLIENT_CPU)})
    server.wait_ready(timeout=180)
    return server


def run_database_script(args, run):
    """Runs `run(args)` with the binary checked, its server and files cleaned up however it
    ends, and prints the report it answers (also to --output)."""
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"no server binary at {args.binary}: run `cargo build --release` "
                         "or pass --binary")
    args.binary = os.path.abspath(args.binary)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        report = run(args)
    except KeyboardInterrupt:
        log("interrupted: stopping the server and removing temporary files")
        sys.exit(130)
    finally:
        cleanup()
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report + "\n")


def measure_startup(args, results):
    db = accounts_db(args)
    workdir = tempdir()
    runs = []
    # One untimed start first: it applies any pending migration and warms the page cache,
    # so every timed run starts from the same warm state. Unpinned: start-up has no load
    # generator to keep apart from, and a server has all its cores when it starts.
    for i in range(args.startup_runs + 1):
        server = Server(args, f"sqlite://{db}", workdir, pinned=False)
        try:
            seconds = server.wait_ready(timeout=120)
            rss, hwm = server.memory_kib()
        finally:
            server.stop()
        if i > 0:
            runs.append((seconds, rss, hwm))
            log(f"start-up run {i}: ready in {seconds:.3f} s, VmRSS {rss} KiB, VmHWM {hwm} KiB")
    results["startup"] = {
        "runs": runs,
        "startup_s": statistics.median(r[0] for r in runs),
        "rss_kib": statistics.median(r[1] for r in runs),
        "hwm_kib": statistics.median(r[2] for r in runs),
    }


def measure_lookup(args, results):
    db = accounts_db(args)
    workdir = tempdir()
    seed = int(time.time())
    scripts = {
        "lookup": write_lua(workdir, "lookup.lua", LOOKUP_LUA.format(
            accounts=args.accounts, seed=seed, prefix="/keys/acct-")),
        "healthz": write_lua(workdir, "healthz.lua", LOOKUP_LUA.format(
            accounts=args.accounts, seed=seed, prefix="/healthz?acct-")),
    }
    server = Server(args, f"sqlite://{db}", workdir)
    runs = {"lookup": [], "healthz": []}
    try:
        server.wait_ready(timeout=120)
        wrk(server.port, scripts["lookup"], 2)  # warm-up, not counted
        for round_no in range(args.rounds):
            order = ("healthz", "lookup") if round_no % 2 == 0 else ("lookup", "healthz")
            for route in order:
                r = wrk(server.port, scripts[route], args.duration)
                runs[route].append(r)
                log(f"round {round_no + 1} {route}: {r['rps']:.0f} req/s, p50 {r['p50_ms']} ms, "
                    f"p99 {r['p99_ms']} ms, non-2xx {r['non2xx']}, socket errors "
                    f"{r['socket_errors']}")
    finally:
        server.stop()
    med = lambda route, key: statistics.median(r[key] for r in runs[route])
    results["lookup"] = {
        "lookup_rps": med("lookup", "rps"),
        "healthz_rps": med("healthz", "rps"),
        "p50_ms": med("lookup", "p50_ms"),
        "p99_ms": med("lookup", "p99_ms"),
        "non2xx": sum(r["non2xx"] for rs in runs.values() for r in rs),
        "runs": runs,
        # Each round measures both routes back to back, so its ratio is the least
        # disturbed by the machine's load drifting; the median of those is the figure.
        "round_ratios": [lk["rps"] / hz["rps"] for lk, hz in zip(runs["lookup"], runs["healthz"])],
    }
    results["lookup"]["ratio"] = statistics.median(results["lookup"]["round_ratios"])


def ceiling_binary(args):
    if args.ceiling_binary:
        return args.ceiling_binary
    out = subprocess.run(["cargo", "bench", "--bench", "store_ceiling", "--no-run",
                          "--message-format=json"], cwd=REPO, capture_output=True, text=True,
                         timeout=1800)
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "store_ceiling":
            args.ceiling_binary = msg["executable"]
            return args.ceiling_binary
    raise SystemExit(f"cannot build benches/store_ceiling.rs:\n{out.stderr[-3000:]}")


def run_ceiling(args, url):
    cmd = ["taskset", "-c", SERVER_CPU, ceiling_binary(args), "--secs", str(args.ceiling_secs),
           url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ceiling_secs * 2 + 120)
    if out.returncode != 0:
        raise SystemExit(f"store_ceiling failed:\n{out.stdout}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["store_ceiling"]


def psql(url, sql):
    subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql], check=True,
                   capture_output=True, timeout=60)


def pg_database_url(url, name):
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def allocate_once(args, backend, database_url, workdir):
    server = Server(args, database_url, workdir)
    script = write_lua(workdir, f"allocate-{backend}.lua",
                       ALLOCATE_LUA.format(prefix=f"new-{os.getpid()}-{int(time.time())}"))
    try:
        server.wait_ready(timeout=120)
        r = wrk(server.port, script, args.alloc_duration)
    finally:
        server.stop()
    r["allocs_per_s"] = r.get("created", 0) / r["seconds"]
    return r


def allocate_round(args, backend, server_url, workdir, round_no):
    """One round: allocations on a fresh database and the ceilings, in alternating order
    from round to round so that a drift of the machine's speed does not favour either."""
    def allocate():
        if backend == "sqlite":
            db = os.path.join(workdir, f"allocate-{round_no}.db")
            r = allocate_once(args, backend, f"sqlite://{db}", workdir)
            with sqlite3.connect(db) as conn:
                r["rows"] = conn.execute("SELECT count(*) FROM assignments").fetchone()[0]
            return r
        name = f"keyspread_bench_{os.getpid()}_{round_no}"
        psql(server_url, f"DROP DATABASE IF EXISTS {name}")
        psql(server_url, f"CREATE DATABASE {name}")
        try:
            return allocate_once(args, backend, pg_database_url(server_url, name), workdir)
        finally:
            psql(server_url, f"DROP DATABASE IF EXISTS {name}")

    def ceiling():
        if backend == "sqlite":
            return run_ceiling(args, f"sqlite://{os.path.join(workdir, f'ceiling-{round_no}.db')}")
        return run_ceiling(args, server_url)

    if round_no % 2 == 0:
        r, c = allocate(), ceiling()
    else:
        c = ceiling()
        r = allocate()
    r["ceiling_one"] = c["one_per_tx_rows_per_s"]
    r["ceiling_batched"] = c["batched_rows_per_s"]
    # Absent from a store_ceiling built from an older tree.
    r["group_write"] = c.get("group_write_rows_per_s")
    if r["group_write"]:
        r["group_over_batched"] = r["group_write"] / r["ceiling_batched"]
    r["over_one"] = r["allocs_per_s"] / r["ceiling_one"]
    r["over_batched"] = r["allocs_per_s"] / r["ceiling_batched"]
    log(f"{backend} round {round_no + 1}: {r['allocs_per_s']:.0f} allocations/s (201: "
        f"{r.get('created')}, other: {r.get('other')}, socket errors {r['socket_errors']}), "
        f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms; ceilings {r['ceiling_one']:.0f} rows/s "
        f"one per transaction ({r['over_one']:.1f}×), {r['ceiling_batched']:.0f} rows/s "
        f"batched ({r['over_batched']:.2f}×)")
    return r


def measure_allocate(args, results):
    workdir = tempdir()
    backends = [("sqlite", None)]
    if args.postgres:
        if shutil.which("psql") is None:
            log("psql not found (apt-get install -y postgresql-client): Postgres skipped")
        else:
            backends.append(("postgres", args.postgres))
    for backend, server_url in backends:
        rounds = [allocate_round(args, backend, server_url, workdir, n)
                  for n in range(args.alloc_rounds)]
        # Each round's ratios compare runs minutes apart at most; the medians are the figures.
        med = lambda key: statistics.median(r[key] for r in rounds)
        summary = {key: med(key) for key in ("allocs_per_s", "p50_ms", "p99_ms", "ceiling_one",
                                             "ceiling_batched", "over_one", "over_batched")}
        if all(r["group_write"] for r in rounds):
            summary["group_write"] = med("group_write")
            summary["group_over_batched"] = med("group_over_batched")
        for key in ("created", "other", "rows"):
            if all(key in r for r in rounds):
                summary[key] = sum(r[key] for r in rounds)
        summary["rounds"] = rounds
        results.setdefault("allocate", {})[backend] = summary


# ---------------------------------------------------------------- criterion and memory bench


def criterion_rows(criterion_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(criterion_dir, "*", "*", "new", "estimates.json"))):
        try:
            bench = json.load(open(os.path.join(os.path.dirname(path), "benchmark.json")))
            elements = bench["throughput"]["Elements"]
            ns = json.load(open(path))["median"]["point_estimate"] / elements
        except (OSError, KeyError, TypeError, ValueError):
            continue
        rows.append((f"tree: {bench['full_id']} (criterion median)", f"{ns:,.0f} ns/allocation",
                     "—", ""))
    return rows


def memory_rows(memory_log):
    rows = []
    for line in open(memory_log, errors="replace"):
        m = re.match(r"(\w+): (\d+) keys in ([\d.]+) s; VmRSS (\d+) -> (\d+) KiB \((\d+) bytes/key\)",
                     line)
        if m:
            rows.append((f"tree memory: {m.group(2)} keys {m.group(1)}",
                         f"{int(m.group(5)) / 1024:,.0f} MiB VmRSS ({m.group(6)} bytes/key)", "—",
                         ""))
    return rows


# ---------------------------------------------------------------- report


def verdict(key, value):
    op, bound, unit = TARGETS[key]
    ok = value >= bound if op == ">=" else value <= bound
    return f"{'≥' if op == '>=' else '≤'} {bound:g}{unit}", "yes" if ok else "**no**"


def table(results, args):
    rows = []
    if "lookup" in results:
        lk = results["lookup"]
        rows.append(("lookup `GET /keys/{account}` (1M accounts)", f"{lk['lookup_rps']:,.0f} req/s",
                     "—", ""))
        rows.append(("`GET /healthz`, same binary and run", f"{lk['healthz_rps']:,.0f} req/s", "—", ""))
        rounds = ", ".join(f"{r:.2f}" for r in lk["round_ratios"])
        rows.append(("lookup ÷ healthz", f"{lk['ratio']:.2f}× (rounds: {rounds})",
                     *verdict("lookup_ratio", lk["ratio"])))
        rows.append(("lookup latency p50 / p99", f"{lk['p50_ms']:.2f} / {lk['p99_ms']:.2f} ms", "—", ""))
        rows.append(("lookup non-2xx responses", f"{lk['non2xx']}", "0",
                     "yes" if lk["non2xx"] == 0 else "**no**"))
    for backend, r in results.get("allocate", {}).items():
        name = {"sqlite": "SQLite", "postgres": "Postgres"}[backend]
        bad = r.get("other", 0)
        rows.append((f"{name}: allocations (64 connections, new accounts)",
                     f"{r['allocs_per_s']:,.0f} /s", "—", ""))
        rows.append((f"{name}: allocation latency p50 / p99",
                     f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms", "—", ""))
        extra = f", {r['rows']:,} rows committed" if "rows" in r else ""
        rows.append((f"{name}: non-201 answers", f"{bad} of {r.get('created', 0) + bad:,}{extra}",
                     "0", "yes" if bad == 0 else "**no**"))
        rows.append((f"{name}: ceiling, one row per transaction", f"{r['ceiling_one']:,.0f} rows/s",
                     "—", ""))
        rows.append((f"{name}: ceiling, {BATCH_ROWS} rows per transaction",
                     f"{r['ceiling_batched']:,.0f} rows/s", "—", ""))
        if r.get("group_write"):
            rows.append((f"{name}: the server's group write alone, {CONNECTIONS} accounts per "
                         "transaction, no HTTP",
                         f"{r['group_write']:,.0f} accounts/s "
                         f"({r['group_over_batched']:.2f}× batched)", "—", ""))
        one = ", ".join(f"{x['over_one']:.1f}" for x in r["rounds"])
        batched = ", ".join(f"{x['over_batched']:.2f}" for x in r["rounds"])
        rows.append((f"{name}: allocations ÷ one-per-transaction ceiling",
                     f"{r['over_one']:.1f}× (rounds: {one})", *verdict("alloc_over_one", r["over_one"])))
        rows.append((f"{name}: allocations ÷ batched ceiling",
                     f"{r['over_batched']:.2f}× (rounds: {batched})",
                     *verdict("alloc_over_batched", r["over_batched"])))
    if "startup" in results:
        st = results["startup"]
        runs = ", ".join(f"{r[0]:.2f}" for r in st["runs"])
        rows.append(("start-up to `/readyz` 200 (1M accounts, SQLite)",
                     f"{st['startup_s']:.2f} s (runs: {runs})", *verdict("startup_s", st["startup_s"])))
        for label, kib in (("VmRSS once ready", st["rss_kib"]), ("VmHWM once ready", st["hwm_kib"])):
            mb = kib * 1024 / 1e6
            rows.append((f"{label} (1M accounts)", f"{mb:.0f} MB ({kib / 1024:.0f} MiB)",
                         *verdict("rss_mb", mb)))
    if args.criterion and os.path.isdir(args.criterion):
        rows += criterion_rows(args.criterion)
    if args.memory_log and os.path.exists(args.memory_log):
        rows += memory_rows(args.memory_log)
    lines = ["| figure | value | target | met? |", "| --- | ---: | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def configuration(args, commands):
    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "0")
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0]
    lines = [
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine shared with other work",
        f"- CPU: {cpu}, {os.cpu_count()} cores; memory {int(mem) / 1024 / 1024:.1f} GiB; "
        f"kernel {platform.release()}; load average at the start {args.load_before}, "
        f"at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        f"- binary: `{args.binary}` (extra serve flags: "
        f"{' '.join(serve_extra_flags(args.binary)) or 'none'})",
        f"- pinning: server and ceiling bench `taskset -c {SERVER_CPU}` (one tokio worker), "
        f"wrk `taskset -c {CLIENT_CPU}`; Postgres itself unpinned",
        f"- client: {wrk_version}, `-t1 -c{CONNECTIONS} --latency`, Lua scripts on every route",
    ]
    if "lookup" in commands:
        hot = (f"every {args.hot_every}th with {args.hot_fanout} keys" if args.hot_every
               else "none with several keys")
        lines.append(f"- lookup: {args.accounts:,} accounts in SQLite ({hot}), random existing accounts; "
                     f"{args.rounds} rounds × {args.duration} s per route, alternating; the ratio "
                     "is the median of the rounds' ratios, rates and latencies medians; 2 s warm-up")
    if "allocate" in commands:
        lines.append(f"- allocation: {args.alloc_rounds} rounds per backend, each {args.alloc_duration} s "
                     f"of allocations on a fresh database, every request a new account, and the "
                     f"ceilings (`benches/store_ceiling.rs`, one writer, {args.ceiling_secs} s per "
                     "mode, same database server and settings: SQLite WAL, synchronous=FULL), in "
                     "alternating order; ratios are medians of the rounds' ratios, rates and "
                     "latencies medians, answers summed")
    if "startup" in commands:
        lines.append(f"- start-up: {args.accounts:,} accounts in SQLite, page cache warm (one "
                     f"untimed start first), /readyz polled every 5 ms, median of "
                     f"{args.startup_runs} runs")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["startup", "lookup", "allocate", "all"])
    parser.add_argument("--binary", default=os.path.join(TARGET_DIR, "release", "keyspread"),
                        help="server binary (default: the release build in CARGO_TARGET_DIR "
                             "or ./target)")
    parser.add_argument("--postgres", default=os.environ.get("KEYSPREAD_BENCH_POSTGRES"),
                        help="a Postgres server URL to also measure allocations on (env "
                             "KEYSPREAD_BENCH_POSTGRES); scratch databases are created and dropped")
    parser.add_argument("--accounts", type=int, default=1_000_000)
    parser.add_argument("--hot-every", type=int, default=100,
                        help="every Nth account is hot (0: none); default 1 %%")
    parser.add_argument("--hot-fanout", type=int, default=16, help="keys of a hot account")
    parser.add_argument("--rounds", type=int, default=5, help="lookup rounds per route")
    parser.add_argument("--duration", type=int, default=6, help="seconds per lookup round")
    parser.add_argument("--alloc-rounds", type=int, default=3,
                        help="allocation rounds per backend (allocations and ceilings each)")
    parser.add_argument("--alloc-duration", type=int, default=8, help="seconds per allocation round")
    parser.add_argument("--ceiling-secs", type=float, default=5.0, help="seconds per ceiling mode")
    parser.add_argument("--startup-runs", type=int, default=3)
    parser.add_argument("--ceiling-binary", help="a built benches/store_ceiling.rs (default: "
                                                 "built with cargo)")
    parser.add_argument("--cache-dir", default=os.path.join(TARGET_DIR, "keyspread-bench"),
                        help="where the 1M-account database is kept between runs")
    parser.add_argument("--criterion", help="a criterion output directory to add headlines from")
    parser.add_argument("--memory-log", help="output of `cargo bench --bench memory` to add")
    parser.add_argument("--output", help="also write the table and configuration to this file")
    args = parser.parse_args()

    check_tools()
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"no server binary at {args.binary}: run `cargo build --release` "
                         "or pass --binary")
    args.binary = os.path.abspath(args.binary)
    args.load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    commands = ["startup", "lookup", "allocate"] if args.command == "all" else [args.command]
    signal.signal(signal.SIGTERM, _on_signal)
    results = {}
    try:
        for command in commands:
            log(f"--- {command}")
            {"startup": measure_startup, "lookup": measure_lookup,
             "allocate": measure_allocate}[command](args, results)
    except KeyboardInterrupt:
        log("interrupted: stopping servers and removing temporary files")
        cleanup()
        sys.exit(130)
    finally:
        cleanup()
    report = f"{table(results, args)}\n\nConfiguration:\n\n{configuration(args, commands)}\n"
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
