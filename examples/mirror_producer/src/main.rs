//! An order-safe Kinesis producer that takes its keys from keyspread's mirror.
//!
//!     keyspread-mirror-producer --keyspread http://127.0.0.1:8080 --stream orders \
//!         [--endpoint-url http://127.0.0.1:4567] [--allocate] < records.tsv
//!
//! One record per line of stdin: `ACCOUNT<TAB>SUB_KEY<TAB>DATA` (an empty SUB_KEY: the
//! account's first key). Every key comes from a `keyspread_client::Mirror`: no request to
//! keyspread per record or per account, and records keep flowing while keyspread is away,
//! until the mirror could have missed a switch (then it stops with the mirror's error).
//! The order rules are the README's (examples/order_safe_producer.py does the same in
//! Python):
//! 1. The key in force when the record is sent, by this machine's clock; in the last half
//!    second before an account's switch its records wait for the switch.
//! 2. At most one record per account key in a PutRecords call.
//! 3. A failed record is resent before that key's next one (it stays at its queue's head).
//!
//! Every record Kinesis took is counted under its key and reported to keyspread's
//! `POST /load/producers` (every 10 s and at the end), so the closed loop sees what the
//! producer sends.
//!
//! Credentials and region as the AWS SDK reads them (AWS_ACCESS_KEY_ID, AWS_REGION...).

use std::collections::{HashSet, VecDeque};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use keyspread_client::{Mirror, now_ms};
use tokio::io::AsyncBufReadExt;

/// Kinesis takes at most 500 records in one PutRecords call.
const MAX_RECORDS_PER_CALL: usize = 500;
/// Milliseconds before a switch during which an account's records wait for it.
const SWITCH_GUARD_MS: i64 = 500;

struct Args {
    keyspread: String,
    stream: String,
    endpoint_url: Option<String>,
    allocate: bool,
}

fn args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut keyspread, mut stream, mut endpoint_url, mut allocate) = (None, None, None, false);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--keyspread" => keyspread = Some(value()?),
            "--stream" => stream = Some(value()?),
            "--endpoint-url" => endpoint_url = Some(value()?),
            "--allocate" => allocate = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        keyspread: keyspread.ok_or("--keyspread URL is required")?,
        stream: stream.ok_or("--stream NAME is required")?,
        endpoint_url,
        allocate,
    })
}

/// A record waiting to be sent: under which account and sub-key, and its bytes.
type Queue = ((String, String), VecDeque<Vec<u8>>);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keyspread-mirror-producer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let args = args()?;
    let mirror = Mirror::start(&args.keyspread)
        .await
        .map_err(|e| format!("{e}"))?;
    // HTTPS on rustls with ring, as keyspread's own Kinesis client.
    let https = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let mut config = aws_config::from_env().http_client(https);
    if let Some(url) = &args.endpoint_url {
        config = config.endpoint_url(url);
    }
    let kinesis = aws_sdk_kinesis::Client::new(&config.load().await);

    // Read everything first: queues per (account, sub-key), in arrival order.
    let mut queues: Vec<Queue> = Vec::new();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        let mut parts = line.splitn(3, '\t');
        let (account, sub_key, data) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        if account.is_empty() {
            continue;
        }
        let at = (account.to_owned(), sub_key.to_owned());
        match queues.iter_mut().find(|(k, _)| *k == at) {
            Some((_, queue)) => queue.push_back(data.as_bytes().to_vec()),
            None => queues.push((at, VecDeque::from([data.as_bytes().to_vec()]))),
        }
    }
    if args.allocate {
        let accounts: HashSet<&String> = queues.iter().map(|((a, _), _)| a).collect();
        for account in accounts {
            mirror.allocate(account).await.map_err(|e| e.to_string())?;
        }
    }

    let (mut sent, mut resent) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(120);
    while queues.iter().any(|(_, q)| !q.is_empty()) {
        if Instant::now() > deadline {
            return Err("records still queued after 120 s".into());
        }
        let mut heads = Vec::new();
        let mut entries = Vec::new();
        let mut used = HashSet::new();
        for (i, ((account, sub_key), queue)) in queues.iter().enumerate() {
            let Some(data) = queue.front() else { continue };
            let lookup = (mirror.lookup(account).map_err(|e| e.to_string()))?.ok_or(format!(
                "{account:?} holds no key (allocate it, or pass --allocate)"
            ))?;
            if lookup
                .next
                .as_ref()
                .is_some_and(|n| n.at - now_ms() < SWITCH_GUARD_MS)
            {
                continue; // its switch is due: wait for it
            }
            let index = if sub_key.is_empty() {
                0
            } else {
                keyspace_index(sub_key, lookup.keys.len())
            };
            if !used.insert((account.clone(), index)) {
                continue; // one record per account key in a call
            }
            let key = lookup.keys[index].clone();
            let entry = PutRecordsRequestEntry::builder()
                .data(Blob::new(data.clone()))
                .partition_key(account.chars().take(256).collect::<String>())
                .explicit_hash_key(key.clone())
                .build()
                .map_err(|e| e.to_string())?;
            heads.push((i, key));
            entries.push(entry);
            if heads.len() == MAX_RECORDS_PER_CALL {
                break;
            }
        }
        if heads.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let answer = (kinesis.put_records())
            .stream_name(&args.stream)
            .set_records(Some(entries))
            .send()
            .await
            .map_err(|e| {
                format!(
                    "PutRecords: {}",
                    aws_sdk_kinesis::error::DisplayErrorContext(e)
                )
            })?;
        for ((i, key), result) in heads.into_iter().zip(answer.records()) {
            if result.error_code().is_some() {
                resent += 1;
            } else {
                let ((account, _), queue) = &mut queues[i];
                let data = queue.pop_front().unwrap_or_default();
                mirror.sent(account, &key, data.len() as u64);
                sent += 1;
            }
        }
    }
    // What was sent since the last report reaches keyspread's load before the exit.
    mirror.close().await;
    println!("sent {sent} records, {resent} resent after a failure");
    Ok(())
}

/// The index of the key records of `sub_key` use among `fanout` keys: the same jump hash
/// the mirror's `key_for` and the server's `GET /shard-of?sub_key=` use.
fn keyspace_index(sub_key: &str, fanout: usize) -> usize {
    keyspread_client::sub_key_index(sub_key, fanout as u32) as usize
}
