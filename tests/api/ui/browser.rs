//! Headless Chromium, as a person's browser: the DOM it built from a page, and a picture.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

/// Longest one Chromium run may take before the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// Chromium with a profile of its own, removed with it.
pub struct Browser {
    program: PathBuf,
    profile: tempfile::TempDir,
}

impl Browser {
    /// `KEYSPREAD_TEST_CHROMIUM`, else `chromium` on PATH. Missing, the test is skipped,
    /// except under CI, where it fails.
    pub fn find(test: &str) -> Option<Browser> {
        let program = match std::env::var_os("KEYSPREAD_TEST_CHROMIUM") {
            Some(program) => PathBuf::from(program),
            None => crate::helpers::required_tool("chromium", test)?,
        };
        let profile = tempfile::tempdir().expect("temp dir for the profile");
        Some(Browser { program, profile })
    }

    /// The DOM Chromium built from `url`, serialized.
    pub async fn dom(&self, url: &str) -> String {
        let out = self.run(&["--dump-dom", url]).await;
        String::from_utf8(out.stdout).expect("the DOM is UTF-8")
    }

    /// A PNG of `url` in a window of `width` × `height` pixels, written to `file`.
    pub async fn screenshot(&self, url: &str, file: &Path, (width, height): (u32, u32)) {
        let shot = format!("--screenshot={}", file.display());
        let size = format!("--window-size={width},{height}");
        self.run(&[&shot, &size, "--hide-scrollbars", url]).await;
        let png = std::fs::read(file).expect("Chromium wrote the screenshot");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    }

    async fn run(&self, args: &[&str]) -> Output {
        // Root needs --no-sandbox; the rest keeps Chromium from reaching out on its own.
        let profile = format!("--user-data-dir={}", self.profile.path().display());
        let run = Command::new(&self.program)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .args(["--no-default-browser-check", "--disable-extensions"])
            .args([
                "--disable-background-networking",
                "--disable-component-update",
            ])
            .args(["--disable-sync", "--mute-audio"])
            .arg(profile)
            .args(args)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(RUN_LIMIT, run)
            .await
            .unwrap_or_else(|_| panic!("chromium {args:?} took over {RUN_LIMIT:?}"))
            .expect("chromium starts");
        assert!(
            out.status.success(),
            "chromium {args:?} failed ({})\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}
