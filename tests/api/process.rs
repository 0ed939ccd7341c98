//! The real `keyspread` binary as a child process, for tests that run several, kill or
//! restart them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `keyspread serve` process on a loopback port; killed when dropped, its log printed
/// if the test failed.
pub struct Server {
    child: Option<Child>,
    log: PathBuf,
    /// Where this process's lines start in `log`.
    log_from: u64,
    /// `http://127.0.0.1:PORT`, known once [`Server::wait_ready`] has returned.
    pub url: String,
}

impl Server {
    /// Starts `keyspread serve` on a port the system picks (so no other test can take it
    /// between choosing and binding) over `database_url`, appending its log to `log`
    /// (restarts share one file). [`Server::wait_ready`] learns the port from the log.
    pub fn spawn(database_url: &str, log: &Path) -> Server {
        Server::spawn_with(database_url, log, &[])
    }

    /// [`Server::spawn`] with more environment: settings, or a fake clock (`LD_PRELOAD`).
    pub fn spawn_with(database_url: &str, log: &Path, env: &[(&str, &str)]) -> Server {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open the server log");
        let log_from = stderr.metadata().expect("the server log's size").len();
        let child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .env("KEYSPREAD_LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "info,sqlx=warn,tower_http=warn")
            // Every client here is on loopback, one address: no per-client limit.
            .env("KEYSPREAD_MUTATION_RATE", "0")
            // Replays in the tests assume Kinesis' keyspace and balancing over it.
            .env_remove("KEYSPREAD_KEYSPACE_BITS")
            .env_remove("KEYSPREAD_TOKEN")
            .env_remove("KEYSPREAD_PRIMARY_STREAM")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start keyspread");
        Server {
            child: Some(child),
            log: log.to_owned(),
            log_from,
            url: String::new(),
        }
    }

    /// Waits until the server says where it listens and `/readyz` there answers 200;
    /// panics if the process exits first or after 30 s.
    pub async fn wait_ready(&mut self, client: &reqwest::Client) {
        let started = Instant::now();
        loop {
            if self.url.is_empty()
                && let Some(addr) = self.listening_on()
            {
                self.url = format!("http://{addr}");
            }
            if !self.url.is_empty() {
                let ready = client.get(format!("{}/readyz", self.url)).send().await;
                if ready.is_ok_and(|r| r.status() == 200) {
                    return;
                }
            }
            let child = self.child.as_mut().expect("a running server");
            if let Some(exit) = child.try_wait().unwrap() {
                panic!("the server exited before it was ready: {exit}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the server was not ready after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What this process has logged so far.
    pub fn log_text(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(text.get(self.log_from as usize..).unwrap_or_default()).into_owned()
    }

    /// The address in this process's `listening addr=...` log line, once written.
    fn listening_on(&self) -> Option<String> {
        let ours = self.log_text();
        let line = ours.lines().find(|l| l.contains(" listening addr="))?;
        let addr = line
            .split(" listening addr=")
            .nth(1)?
            .split_whitespace()
            .next()?;
        Some(addr.to_owned())
    }

    /// Sends `signal` (`STOP`, `CONT`...) to the process, which this test started.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("a running server");
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {}", child.id());
    }

    /// Waits up to `limit` for the process to exit: its status, or `None` if it still runs.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        let child = self.child.as_mut().expect("a running server");
        loop {
            if let Some(exit) = child.try_wait().unwrap() {
                return Some(exit);
            }
            if started.elapsed() >= limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the process with SIGKILL (no shutdown of any kind) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("--- last lines of {}:", self.log.display());
            tail.iter().rev().for_each(|line| eprintln!("{line}"));
        }
    }
}

/// xorshift64*: cheap, seedable, and random enough to mix operations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % n
    }
}
