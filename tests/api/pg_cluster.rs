//! A Postgres cluster of a test's own, for what must never be done to a shared server
//! (settings for the whole server, a standby, a promotion): initdb in a temporary
//! directory, a free port on 127.0.0.1, stopped and removed when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

use sqlx::Connection;

/// A running cluster that trusts local logins, with its data in a temporary directory.
pub struct Cluster {
    bin: PathBuf,
    /// Runs the binaries as this user (initdb refuses root).
    user: Option<&'static str>,
    pub data: PathBuf,
    pub port: u16,
    // Held so the directory outlives the server.
    dir: tempfile::TempDir,
}

impl Cluster {
    /// A new cluster for `test`; `None` (the test recorded as skipped) where the Postgres
    /// binaries, or as root the `postgres` user, are missing.
    pub fn start(test: &str) -> Option<Cluster> {
        let bin = binaries(test)?;
        let root = unsafe { libc::geteuid() } == 0;
        if root && !user_exists("postgres") {
            crate::skip::skipped(test, "no `postgres` user to run initdb as (root cannot)");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let cluster = Cluster {
            bin,
            user: root.then_some("postgres"),
            data: dir.path().join("primary"),
            port: free_port(),
            dir,
        };
        cluster.own(cluster.dir.path());
        cluster.run(
            "initdb",
            &[
                "-D",
                path(&cluster.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--no-instructions",
            ],
        );
        cluster.start_server(&cluster.data, cluster.port);
        Some(cluster)
    }

    /// Starts the server of data directory `data` on `port`, waiting until it answers.
    pub fn start_server(&self, data: &Path, port: u16) {
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off",
            path(self.dir.path())
        );
        let log = data.with_extension("log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                path(data),
                "-l",
                path(&log),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        );
    }

    /// The URL of database `name` on the server listening on `port`.
    pub fn url_on(port: u16, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{name}")
    }

    /// The URL of database `name` on this cluster's server.
    pub fn url(&self, name: &str) -> String {
        Cluster::url_on(self.port, name)
    }

    /// A connection to the `postgres` database, as the superuser.
    pub async fn admin(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.url("postgres"))
            .await
            .expect("connect to the test's own cluster")
    }

    /// Creates database `name` and answers its URL.
    pub async fn create_database(&self, name: &str) -> String {
        let mut admin = self.admin().await;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        self.url(name)
    }

    /// Runs Postgres program `program` with `args`, as the cluster's user, failing the test
    /// (with the program's output) if it fails.
    pub fn run(&self, program: &str, args: &[&str]) {
        let done = self
            .command(program, args)
            .output()
            .expect("run a Postgres program");
        assert!(
            done.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        );
    }

    /// Postgres program `program` with `args`, to run as the cluster's user.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let program = self.bin.join(program);
        let mut command = match self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        command.args(args).current_dir(self.dir.path());
        command
    }

    /// Where a data directory named `name` goes, beside the primary's.
    pub fn beside(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Stops the server of data directory `data` cleanly (`-m fast`): a standby connected
    /// to it receives everything it wrote first.
    pub fn stop_server(&self, data: &Path) {
        self.run("pg_ctl", &["-D", path(data), "-m", "fast", "-w", "stop"]);
    }

    /// Gives `dir` to the cluster's user.
    pub fn own(&self, dir: &Path) {
        if let Some(user) = self.user {
            let done = Command::new("chown")
                .args(["-R", user, path(dir)])
                .status()
                .expect("chown");
            assert!(done.success(), "chown {}", dir.display());
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Every data directory under the cluster's: a standby's too.
        let entries = std::fs::read_dir(self.dir.path()).into_iter().flatten();
        for data in entries.flatten().map(|e| e.path()) {
            if data.join("postmaster.pid").exists() {
                let stop = ["-D", path(&data), "-m", "immediate", "-w", "stop"];
                let _ = self.command("pg_ctl", &stop).output();
            }
        }
    }
}

/// The directory holding initdb, pg_ctl and pg_basebackup: on PATH, else Debian's newest;
/// `None`, with `test` recorded as skipped, where there is none.
fn binaries(test: &str) -> Option<PathBuf> {
    let pg_ctl = crate::skip::required_tool("pg_ctl", test)?;
    let dir = std::fs::canonicalize(&pg_ctl)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))?;
    let complete = ["initdb", "pg_basebackup"]
        .iter()
        .all(|p| dir.join(p).is_file());
    if !complete {
        crate::skip::skipped(test, "initdb and pg_basebackup are not beside pg_ctl");
        return None;
    }
    Some(dir)
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    probe.local_addr().expect("local address").port()
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}
