//! One integration-test binary: the real server, on port 0, over a fresh database per test.

mod helpers;
mod process;
mod replay;

mod abuse;
mod crash;
mod errors;
mod heavy;
mod import;
mod keys;
mod kinesalite;
mod kinesis;
mod lifecycle;
mod observability;
mod outage;
mod python_client;
mod rebalance;
mod replicas;
mod reshard;
mod schemathesis;
mod shards;
mod store;
mod streams;
