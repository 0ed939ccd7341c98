//! One integration-test binary: the real server, on port 0, over a fresh database per test.

mod helpers;
mod process;
mod replay;

mod abuse;
mod bounds;
mod crash;
mod cross_site;
mod errors;
mod fanout;
mod fanout_kinesis;
mod follow;
mod forwarded;
mod heavy;
mod import;
mod keys;
mod kinesalite;
mod kinesis;
mod lifecycle;
mod names;
mod observability;
mod outage;
mod python_client;
mod rate;
mod rebalance;
mod replicas;
mod reshard;
mod schemathesis;
mod secrets;
mod shards;
mod simulate;
mod staged;
mod store;
mod streams;
mod sub_key;
mod truth;
