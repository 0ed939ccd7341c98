//! Allocation-tree speed: time per operation from empty, after random imports and after
//! imports that make the trie as deep as it gets. Run with `cargo bench --bench tree`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, measurement::WallTime};
use keyspread::keyspace::{Allocator, HashKey, Keyspace};

const FROM_EMPTY: u64 = 1_000_000;
const IMPORTED: u64 = 1_000_000;
const AFTER_IMPORT: u64 = 100_000;
/// Walk probes that get a chain of deep neighbours in the deep-chains case.
const DEEP_PROBES: u64 = 4096;
/// Chain length either side of each probe; below 116 so the probes themselves stay free.
const CHAIN_BITS: u32 = 100;

/// splitmix64: a fixed-seed generator, so every run imports the same keys.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_u128(&mut self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }
}

/// Allocates `n` keys of weight 1, answering the time taken.
fn allocate(alloc: &mut Allocator, n: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        black_box(alloc.allocate(1).expect("the keyspace is far from full"));
    }
    start.elapsed()
}

/// Imports random keys until `alloc` holds `total`.
fn import_random(alloc: &mut Allocator, total: u64, seed: u64) {
    let mut rng = SplitMix64(seed);
    while alloc.total().count < total {
        // A collision among 2^128 keys would only cost a retry.
        let _ = alloc.insert(HashKey(rng.next_u128()), 1);
    }
}

/// Imports `2^j` and `u128::MAX - 2^j` with their neighbours: chains 128 deep at both ends.
fn import_powers(alloc: &mut Allocator) {
    for j in 0..128 {
        let p = 1u128 << j;
        for key in [
            p - 1,
            p,
            p + 1,
            u128::MAX - p - 1,
            u128::MAX - p,
            u128::MAX - p + 1,
        ] {
            let _ = alloc.insert(HashKey(key), 1);
        }
    }
}

/// Imports `m ± 2^j` (j < CHAIN_BITS) around the first DEEP_PROBES keys an empty walk picks,
/// so every later walk queries the trie along paths about CHAIN_BITS nodes deep.
fn import_deep_chains(alloc: &mut Allocator) {
    let mut empty = Allocator::new(Keyspace::KINESIS);
    for _ in 0..DEEP_PROBES {
        let m = empty.allocate(1).expect("empty keyspace").0;
        for j in 0..CHAIN_BITS {
            let _ = alloc.insert(HashKey(m + (1 << j)), 1);
            let _ = alloc.insert(HashKey(m - (1 << j)), 1);
        }
    }
}

fn ns_per_op(elapsed: Duration, ops: u64) -> f64 {
    elapsed.as_nanos() as f64 / ops as f64
}

/// Plain summary lines, printed after criterion's own report.
#[derive(Default)]
struct Summary(Vec<String>);

impl Summary {
    fn record(&mut self, case: &str, samples: &mut [f64]) {
        if samples.is_empty() {
            return; // filtered out on the command line
        }
        samples.sort_by(f64::total_cmp);
        let median = samples[samples.len() / 2];
        self.0.push(format!(
            "{case}: {median:.0} ns/op median (min {:.0}, max {:.0}, {} runs)",
            samples[0],
            samples[samples.len() - 1],
            samples.len()
        ));
    }

    fn note(&mut self, line: String) {
        println!("{line}");
        self.0.push(line);
    }
}

/// A group whose samples each run the whole job once: ten runs, no linear ramp.
fn group<'a>(c: &'a mut Criterion, name: &str, ops: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(ops));
    group
}

/// Benches `ops` allocations on fresh clones of an allocator that `prepare` fills (its
/// import time is noted, not benched); building, cloning and dropping are not timed.
fn bench_allocations(
    c: &mut Criterion,
    summary: &mut Summary,
    case: &str,
    ops: u64,
    prepare: impl FnOnce(&mut Allocator),
) {
    let mut prepare = Some(prepare);
    let mut base = None;
    let mut samples = Vec::new();
    let mut group = group(c, case, ops);
    group.bench_function(format!("{ops}_allocations"), |b| {
        // Built on first use, so a case filtered out on the command line costs nothing.
        let base = base.get_or_insert_with(|| {
            let mut alloc = Allocator::new(Keyspace::KINESIS);
            let start = Instant::now();
            (prepare.take().expect("built once"))(&mut alloc);
            (alloc, start.elapsed())
        });
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut alloc = base.0.clone();
                let elapsed = allocate(&mut alloc, ops);
                samples.push(ns_per_op(elapsed, ops));
                total += elapsed;
            }
            total
        })
    });
    group.finish();
    if let Some((alloc, import)) = base {
        let held = alloc.total().count;
        if held > 0 {
            summary.note(format!(
                "{case}: imported {held} keys in {:.2} s, {:.0} ns/key",
                import.as_secs_f64(),
                ns_per_op(import, held)
            ));
        }
    }
    summary.record(case, &mut samples);
}

/// One run from empty, timed per decade of n: flat if the cost is O(log n) with small constants.
fn scaling_from_empty(summary: &mut Summary) {
    let mut alloc = Allocator::new(Keyspace::KINESIS);
    let mut held = 0;
    for upto in [1_000, 10_000, 100_000, FROM_EMPTY] {
        let elapsed = allocate(&mut alloc, upto - held);
        summary.note(format!(
            "scaling from empty, keys {held}..{upto}: {:.0} ns/op (one run)",
            ns_per_op(elapsed, upto - held)
        ));
        held = upto;
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut summary = Summary::default();

    bench_allocations(&mut c, &mut summary, "a_from_empty", FROM_EMPTY, |_| {});
    bench_allocations(
        &mut c,
        &mut summary,
        "b_after_1M_random",
        AFTER_IMPORT,
        |a| import_random(a, IMPORTED, 1),
    );
    bench_allocations(
        &mut c,
        &mut summary,
        "c1_after_powers_and_random",
        AFTER_IMPORT,
        |a| {
            import_powers(a);
            import_random(a, IMPORTED, 2);
        },
    );
    bench_allocations(
        &mut c,
        &mut summary,
        "c2_after_deep_chains_and_random",
        AFTER_IMPORT,
        |a| {
            import_deep_chains(a);
            import_random(a, IMPORTED, 3);
        },
    );
    scaling_from_empty(&mut summary);

    c.final_summary();
    println!("\nsummary (time per allocation, 128-bit keyspace, weight 1):");
    for line in &summary.0 {
        println!("{line}");
    }
}
