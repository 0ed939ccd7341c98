//! Secrets on the command line: database passwords never reach the log, and tokens no
//! client could send are refused at start-up without being echoed.

use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// A password with every character that ends a part of a URL.
const PASSWORD: &str = "s3cr@t:pa55/w?rd#%";
/// The same, percent-encoded as a URL's userinfo or query needs it.
const ENCODED: &str = "s3cr%40t%3Apa55%2Fw%3Frd%23%25";

/// Runs `keyspread` with `args` and `env` until it exits (its status) or `limit` passes
/// (`None`, and it is killed); with everything it wrote on stdout and stderr.
pub fn run(args: &[&str], env: &[(&str, &str)], limit: Duration) -> (Option<ExitStatus>, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("out.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(args)
        .current_dir(dir.path())
        .env("KEYSPREAD_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "trace")
        .env_remove("DATABASE_URL")
        .env_remove("KEYSPREAD_TOKEN")
        .env_remove("KEYSPREAD_METRICS_TOKEN")
        .envs(env.iter().copied())
        .stdout(append(&log))
        .stderr(append(&log))
        .spawn()
        .expect("start keyspread");
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break Some(exit);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (exit, std::fs::read_to_string(&log).unwrap())
}

/// `path`, opened for appending: stdout and stderr share one file without overwriting.
fn append(path: &std::path::Path) -> std::fs::File {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true).open(path).unwrap()
}

fn assert_hidden(out: &str, url: &str) {
    for secret in [PASSWORD, ENCODED, "s3cr", "pa55"] {
        assert!(!out.contains(secret), "{url}: {secret:?} in\n{out}");
    }
}

/// A server pointed at an unreachable Postgres logs where it connects and fails, at trace
/// level, without the password, wherever the URL holds it.
#[test]
fn database_passwords_never_reach_the_log() {
    // Its Postgres is an address nothing answers: the pass's backend plays no part.
    if !crate::skip::sqlite_only("database_passwords_never_reach_the_log") {
        return;
    }
    for url in [
        format!("postgres://app:{PASSWORD}@127.0.0.1:1/keys"),
        "postgres://app:s3cr@t:pa55@127.0.0.1:1/keys".to_owned(),
        format!("postgres://app:{ENCODED}@127.0.0.1:1/keys"),
        format!("postgres://app@127.0.0.1:1/keys?sslmode=disable&password={ENCODED}"),
        "postgres://app@127.0.0.1:1/keys?password=s3cr@t:pa55&sslmode=disable".to_owned(),
    ] {
        let (exit, out) = run(
            &["serve"],
            &[("DATABASE_URL", &url)],
            Duration::from_secs(20),
        );
        let exit = exit.unwrap_or_else(|| panic!("{url}: still running after 20 s"));
        assert!(!exit.success(), "{url}: {out}");
        assert!(out.contains("starting keyspread"), "{url}: {out}");
        assert_hidden(&out, &url);
        let (migrate, out) = run(
            &["migrate", "--database-url", &url],
            &[],
            Duration::from_secs(20),
        );
        assert!(migrate.is_some_and(|m| !m.success()), "{url}: {out}");
        assert_hidden(&out, &url);
    }
}

/// Parameters the Postgres driver does not read are refused before it would log them (it
/// logs an unknown parameter with its value, and ignores it).
#[test]
fn password_parameters_the_driver_ignores_are_refused() {
    for (url, name) in [
        (
            format!("postgres://app@127.0.0.1:1/keys?PASSWORD={ENCODED}"),
            "PASSWORD",
        ),
        (
            format!("postgres://app@127.0.0.1:1/keys?sslpassword={ENCODED}"),
            "sslpassword",
        ),
    ] {
        for args in [vec!["serve"], vec!["migrate", "--database-url", &url]] {
            let (exit, out) = run(&args, &[("DATABASE_URL", &url)], Duration::from_secs(20));
            assert!(exit.is_some_and(|e| !e.success()), "{url}: {out}");
            assert!(
                out.contains(&format!("parameter `{name}`")),
                "{args:?} {url}: {out}"
            );
            assert_hidden(&out, &url);
        }
    }
}

/// With Postgres at hand: a role whose password holds `@`, `:`, `/`, `?`, `#` and `%` logs
/// in with it (in the userinfo or as `password=`), and the log never shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_url_delimiters_logs_in_and_stays_out_of_the_log() {
    let test = "a_password_with_url_delimiters_logs_in_and_stays_out_of_the_log";
    let Some(server) = crate::skip::postgres_only(test) else {
        return;
    };
    let db = crate::helpers::PgDatabase::create(&server).await;
    let (base, name) = db.url.rsplit_once('/').unwrap();
    let host = base.rsplit_once('@').unwrap().1;
    let role = format!("r{}", uuid::Uuid::new_v4().simple());
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    for statement in [
        format!("CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'"),
        format!("ALTER DATABASE {name} OWNER TO {role}"),
        format!("ALTER SCHEMA public OWNER TO {role}"),
    ] {
        sqlx::query(&statement).execute(&mut admin).await.unwrap();
    }
    for url in [
        format!("postgres://{role}:{ENCODED}@{host}/{name}"),
        format!("postgres://{role}@{host}/{name}?password={ENCODED}"),
    ] {
        let (exit, out) = tokio::task::spawn_blocking({
            let url = url.clone();
            move || {
                run(
                    &["serve"],
                    &[("DATABASE_URL", &url)],
                    Duration::from_secs(8),
                )
            }
        })
        .await
        .unwrap();
        assert!(exit.is_none(), "{url}: exited\n{out}");
        assert!(out.contains(" listening addr="), "{url}: {out}");
        assert_hidden(&out, &url);
    }
    drop(admin);
    drop(db);
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&server)
        .await
        .unwrap();
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// A token an HTTP client cannot send in `Authorization: Bearer` (non-ASCII, spaces,
/// control characters) is refused with a clear message that does not repeat it.
#[test]
fn a_token_no_client_could_send_is_refused_at_start_up() {
    for token in [
        "tökentökentökentöken",
        "token with inner spaces ok",
        "token\u{7f}with-a-control-char",
    ] {
        for (args, env) in [
            (vec!["serve"], "KEYSPREAD_TOKEN"),
            (vec!["serve", "--token", token], ""),
            (vec!["serve"], "KEYSPREAD_METRICS_TOKEN"),
            (vec!["serve", "--metrics-token", token], ""),
        ] {
            let env: Vec<(&str, &str)> = [(env, token)]
                .into_iter()
                .filter(|e| !e.0.is_empty())
                .collect();
            let (exit, out) = run(&args, &env, Duration::from_secs(5));
            let what = format!("{args:?} {env:?}");
            let exit = exit.unwrap_or_else(|| panic!("{what}: accepted, still running\n{out}"));
            assert!(!exit.success(), "{what}: {out}");
            assert!(
                out.contains("visible ASCII") && out.contains("token"),
                "{what}: {out}"
            );
            assert!(!out.contains(token), "{what}: the token echoed in\n{out}");
        }
    }
}
