#!/usr/bin/env python3
"""A highly available Postgres on loopback, from Debian's packages: etcd, three Postgres
nodes under Patroni, and HAProxy in front routing to the leader by Patroni's REST checks.

    tests/ha/cluster.py [--mode sync|async] [--dir DIR] -- COMMAND [ARG...]

starts it all under a temporary directory (or DIR), runs COMMAND with the cluster's
addresses in its environment, then stops everything and removes the directory, also on
Ctrl-C or SIGTERM. COMMAND's exit status is this script's. Its environment:

- KEYSPREAD_HA_DATABASE_URL: the database through HAProxy (the leader, whichever it is);
- KEYSPREAD_HA_PATRONICTL: a patronictl config file (`patronictl -c FILE switchover ...`);
- KEYSPREAD_HA_NODES: JSON, per node: name, Postgres port, REST API URL, data directory,
  and the PID of its Patroni (its Postgres' is the first line of `DATA/postmaster.pid`);
- KEYSPREAD_HA_MODE: sync or async.

Everything runs as the `postgres` user (initdb refuses root; nothing here needs it), on
127.0.0.1 ports taken free from the system. The settings, and why:

- Patroni's `ttl` 10 s and `loop_wait` 2 s: a leader that stops renewing its key is
  replaced within about ttl + loop_wait (12 s); shorter, a busy machine's pause could cost
  the leader its key. `retry_timeout` 4 s (under ttl, as Patroni requires).
- `primary_start_timeout: 0` (`master_start_timeout` before Patroni 3): a leader whose
  Postgres dies is not restarted in place (the default waits 300 s for it first); a
  standby is promoted at once.
- `synchronous_mode: true` (sync, the default): a commit returns once a standby has its WAL,
  and only a standby that has it may be promoted: nothing acknowledged is lost. async:
  a promotion may lose what the old leader acknowledged last (`maximum_lag_on_failover`
  1 MiB bounds it).
- HAProxy checks each node's `GET /primary` every second (down after 2 failures, up after
  2 successes) and, with `on-marked-down shutdown-sessions`, closes the sessions to a node
  it marks down: clients reconnect to the new leader rather than wait on the old one.
"""

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = 3
SCOPE = "keyspread-ha"
SUPERUSER = ("postgres", "ha-superuser-pw")
REPLICATOR = ("replicator", "ha-replicator-pw")
# What the drill needs of Postgres: the pool's connections for three replicas, and a few
# more for the checks.
MAX_CONNECTIONS = 300
READY_WITHIN_S = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin():
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        sys.exit("no Postgres here (/usr/lib/postgresql/*/bin): apt-get install postgresql")
    return found[-1].parent


def need(program):
    path = shutil.which(program, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if not path:
        sys.exit(f"{program} is missing: `make ha-drill` installs etcd-server, patroni and haproxy")
    return path


class Cluster:
    def __init__(self, mode, directory=None):
        self.mode = mode
        self.user = "postgres"
        self.owner = pwd.getpwnam(self.user)
        self.keep = directory is not None
        self.dir = Path(directory or tempfile.mkdtemp(prefix="keyspread-ha-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chown(self.dir, self.owner.pw_uid, self.owner.pw_gid)
        self.procs = {}  # name -> Popen
        self.etcd_client = free_port()
        self.etcd_peer = free_port()
        self.haproxy_port = free_port()
        self.nodes = [
            {"name": f"node{i}", "port": free_port(), "rest": free_port(),
             "data": str(self.dir / f"node{i}" / "data")}
            for i in range(1, NODES + 1)
        ]

    # -- set-up -------------------------------------------------------------------------

    def _as_user(self, command):
        runuser = need("runuser")
        return [runuser, "-u", self.user, "--", *command]

    def _spawn(self, name, command, log):
        """Starts `command` as the cluster's user, in a session of its own: its PID is the
        program's (a drill signals it)."""
        out = open(self.dir / log, "ab")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.owner.pw_dir,
               "LANG": "C.UTF-8"}
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True,
                                user=self.owner.pw_uid, group=self.owner.pw_gid, extra_groups=[],
                                env=env)
        self.procs[name] = proc
        return proc

    def _write(self, path, text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for p in [path.parent, path]:
            os.chown(p, self.owner.pw_uid, self.owner.pw_gid)
        os.chmod(path, 0o600)

    def start(self):
        self._start_etcd()
        for node in self.nodes:
            self._start_patroni(node)
        self._start_haproxy()
        self.wait_ready()

    def _start_etcd(self):
        etcd = need("etcd")
        data = self.dir / "etcd"
        data.mkdir()
        os.chown(data, self.owner.pw_uid, self.owner.pw_gid)
        os.chmod(data, 0o700)
        client = f"http://127.0.0.1:{self.etcd_client}"
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        self._spawn("etcd", [
            etcd, "--name", "etcd1", "--data-dir", str(data),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new",
            "--log-level", "warn", "--enable-v2=true",
        ], "etcd.log")

    def _patroni_config(self, node):
        sync = self.mode == "sync"
        home = self.dir / node["name"]
        return {
            "scope": SCOPE,
            "name": node["name"],
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node['rest']}",
                        "connect_address": f"127.0.0.1:{node['rest']}"},
            # etcd's v2 API, not etcd3: Patroni before 3.0.3 (Debian 12 ships 3.0.2) lets a
            # leader that was paused past its key's ttl write the key again over the new
            # leader's on etcd3 (patroni#2689), and the new leader demotes itself: what it
            # acknowledged is rewound away. The v2 API updates the key only if it is still
            # this node's. The drill's "cut leader" found it.
            "etcd": {"host": f"127.0.0.1:{self.etcd_client}"},
            "bootstrap": {
                "dcs": {
                    "ttl": 10,
                    "loop_wait": 2,
                    "retry_timeout": 4,
                    "maximum_lag_on_failover": 1048576,
                    "primary_start_timeout": 0,
                    "synchronous_mode": sync,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": MAX_CONNECTIONS,
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "128MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth-host": "scram-sha-256"},
                           {"auth-local": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node['port']}",
                "connect_address": f"127.0.0.1:{node['port']}",
                "data_dir": node["data"],
                "bin_dir": str(postgres_bin()),
                "pgpass": str(home / "pgpass"),
                "authentication": {
                    "superuser": {"username": SUPERUSER[0], "password": SUPERUSER[1]},
                    "replication": {"username": REPLICATOR[0], "password": REPLICATOR[1]},
                    "rewind": {"username": SUPERUSER[0], "password": SUPERUSER[1]},
                },
                "parameters": {"unix_socket_directories": str(home)},
                "pg_hba": [
                    "local all all trust",
                    f"host replication {REPLICATOR[0]} 127.0.0.1/32 scram-sha-256",
                    "host all all 127.0.0.1/32 scram-sha-256",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False,
                     "nosync": False},
        }

    def _start_patroni(self, node):
        home = self.dir / node["name"]
        config = home / "patroni.yml"
        # JSON is YAML: no YAML writer needed.
        self._write(config, json.dumps(self._patroni_config(node), indent=2))
        node["config"] = str(config)
        self._spawn(node["name"], [need("patroni"), str(config)], f"{node['name']}.log")

    def _start_haproxy(self):
        servers = "\n".join(
            f"    server {n['name']} 127.0.0.1:{n['port']} maxconn {MAX_CONNECTIONS} "
            f"check port {n['rest']}"
            for n in self.nodes)
        config = f"""global
    maxconn {MAX_CONNECTIONS * 2}
    log stderr format short local0 info

defaults
    log global
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s

listen primary
    bind 127.0.0.1:{self.haproxy_port}
    option httpchk OPTIONS /primary
    http-check expect status 200
    default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
{servers}
"""
        path = self.dir / "haproxy.cfg"
        self._write(path, config)
        self._spawn("haproxy", [need("haproxy"), "-f", str(path), "-db"], "haproxy.log")

    # -- what the drill reads --------------------------------------------------------------

    @property
    def database_url(self):
        user, password = SUPERUSER
        return f"postgres://{user}:{password}@127.0.0.1:{self.haproxy_port}/postgres"

    def patronictl_config(self):
        path = self.dir / "patronictl.yml"
        if not path.exists():
            self._write(path, json.dumps({"scope": SCOPE,
                                          "etcd": {"host": f"127.0.0.1:{self.etcd_client}"}}))
        return str(path)

    def rest(self, node, path):
        """Patroni's REST answer for `path` on `node`: (status, JSON or None)."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node['rest']}{path}", timeout=2) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.load(e)
            except ValueError:
                return e.code, None
        except (OSError, ValueError):
            return None, None

    def leader(self):
        for node in self.nodes:
            status, _ = self.rest(node, "/primary")
            if status == 200:
                return node
        return None

    def members(self):
        """Patroni's view of the cluster, by the leader: a list of members (name, role,
        state, lag...), empty without a leader."""
        leader = self.leader()
        if leader is None:
            return []
        _, cluster = self.rest(leader, "/cluster")
        return (cluster or {}).get("members", [])

    def settled(self):
        """A leader, both standbys replicating, and in sync mode one of them synchronous."""
        members = self.members()
        standbys = [m for m in members if m.get("role") in ("replica", "sync_standby")
                    and m.get("state") in ("streaming", "running")]
        synchronous = any(m.get("role") == "sync_standby" for m in members)
        return len(standbys) == NODES - 1 and (synchronous or self.mode == "async")

    def wait_ready(self, within_s=READY_WITHIN_S):
        """Until the cluster is settled and a leader answers through HAProxy."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    sys.exit(f"{name} exited ({proc.returncode}) while starting: see {self.dir}/{name}.log")
            if self.settled() and self._through_haproxy():
                return
            time.sleep(0.5)
        sys.exit(f"the cluster was not ready within {READY_WITHIN_S} s: logs in {self.dir}")

    def _through_haproxy(self):
        psql = postgres_bin() / "psql"
        done = subprocess.run(
            [str(psql), self.database_url, "-Atc", "SELECT pg_is_in_recovery()"],
            capture_output=True, text=True, timeout=10)
        return done.returncode == 0 and done.stdout.strip() == "f"

    def environment(self):
        nodes = [{"name": n["name"], "port": n["port"], "rest": f"http://127.0.0.1:{n['rest']}",
                  "data": n["data"], "patroni_pid": self.procs[n["name"]].pid}
                 for n in self.nodes]
        return {
            "KEYSPREAD_HA_DATABASE_URL": self.database_url,
            "KEYSPREAD_HA_PATRONICTL": self.patronictl_config(),
            "KEYSPREAD_HA_NODES": json.dumps(nodes),
            "KEYSPREAD_HA_MODE": self.mode,
            "KEYSPREAD_HA_DIR": str(self.dir),
        }

    # -- tear-down -----------------------------------------------------------------------

    def stop(self, keep=False):
        # HAProxy first (no new sessions), then the Patroni nodes (each stops its Postgres),
        # then etcd.
        order = ["haproxy"] + [n["name"] for n in self.nodes] + ["etcd"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # A Postgres left behind by a node killed mid-way.
        for node in self.nodes:
            pid_file = Path(node["data"]) / "postmaster.pid"
            if pid_file.exists():
                subprocess.run(self._as_user([str(postgres_bin() / "pg_ctl"), "-D", node["data"],
                                              "-m", "immediate", "stop"]),
                               capture_output=True)
        if not (self.keep or keep):
            shutil.rmtree(self.dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--dir", help="keep the cluster's files here (default: a temporary "
                                      "directory, removed at the end)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run against the cluster after --")
    if os.geteuid() != 0:
        sys.exit("run as root: the cluster runs as the postgres user, which needs runuser")

    cluster = Cluster(args.mode, args.dir)

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    status = 1
    try:
        started = time.monotonic()
        cluster.start()
        leader = cluster.leader()["name"]
        print(f"--- HA Postgres ({args.mode}) ready in {time.monotonic() - started:.1f} s under "
              f"{cluster.dir}: leader {leader}, HAProxy on 127.0.0.1:{cluster.haproxy_port}",
              flush=True)
        status = subprocess.run(command, env={**os.environ, **cluster.environment()}).returncode
    except KeyboardInterrupt as e:
        print(f"--- interrupted ({e or 'SIGINT'}): stopping the cluster", flush=True)
        status = 130
    finally:
        # A failed run keeps the cluster's logs (Patroni's, HAProxy's, etcd's) for its reader.
        keep = status != 0
        cluster.stop(keep)
        print(f"--- the HA cluster is stopped" + (f"; its files are kept in {cluster.dir}"
                                                  if cluster.keep or keep else
                                                  " and its files removed"), flush=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
