//! Allocation-tree speed: time per operation from empty, after random imports and after
//! imports that make the trie as deep as it gets. Run with `cargo bench --bench tree`.

mod common;
use common::SplitMix64;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, measurement::WallTime};
use keyspread::keyspace::{Allocator, HashKey, Keyspace};

const FROM_EMPTY: u64 = 1_000_000;
const IMPORTED: u64 = 1_000_000;
const AFTER_IMPORT: u64 = 100_000;
/// Chain length either side of a deep node; below 116 so no chain reaches another node of
/// the walk's top 12 levels.
const CHAIN_BITS: u32 = 100;

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
        for key in [p - 1, p, p + 1] {
            let _ = alloc.insert(HashKey(key), 1);
            let _ = alloc.insert(HashKey(u128::MAX - key), 1);
        }
    }
}

/// Imports `m ± 2^j` (j < CHAIN_BITS) around the walk's top 12 levels of nodes `m`, so every
/// later walk queries the trie along paths about CHAIN_BITS nodes deep.
fn import_deep_chains(alloc: &mut Allocator) {
    for m in top_nodes(12) {
        for j in 0..CHAIN_BITS {
            let _ = alloc.insert(HashKey(m + (1 << j)), 1);
            let _ = alloc.insert(HashKey(m - (1 << j)), 1);
        }
    }
}

/// The walk's top `2^depth - 1` nodes: `(2c + 1) * 2^(127 - d)` at depth `d`.
fn top_nodes(depth: u32) -> impl Iterator<Item = u128> {
    (0..depth).flat_map(|d| (0..1u128 << d).map(move |c| (2 * c + 1) << (127 - d)))
}

/// Inner nodes on the crit-bit trie's path to `x`: the bits at which the held keys that
/// share x's higher bits fall on both sides.
fn trie_depth(alloc: &Allocator, x: u128) -> u32 {
    let mut depth = 0;
    for bit in (0..128).rev() {
        let high = x & ((!0u128 << bit) << 1);
        let mid = high | (1 << bit);
        let hi = mid | ((1 << bit) - 1);
        let below = alloc.load_in(HashKey(high), HashKey(mid - 1)).count;
        let above = alloc.load_in(HashKey(mid), HashKey(hi)).count;
        if below + above <= 1 {
            break;
        }
        if below > 0 && above > 0 {
            depth += 1;
        }
    }
    depth
}

/// One timed run: the time to reach each mark of allocated keys, stretch by stretch.
struct Run {
    stretches: Vec<Duration>,
    /// Sum over allocations of the walk's depth in the implicit tree.
    levels: u64,
}

/// Stretch ends: decades from 1,000 up to `ops`.
fn marks(ops: u64) -> Vec<u64> {
    let mut marks: Vec<u64> = (3..)
        .map(|e| 10u64.pow(e))
        .take_while(|&m| m < ops)
        .collect();
    marks.push(ops);
    marks
}

/// Allocates keys of weight 1 until `marks.last()` of them are held, timing each stretch.
fn allocate(alloc: &mut Allocator, marks: &[u64]) -> Run {
    let mut run = Run {
        stretches: Vec::with_capacity(marks.len()),
        levels: 0,
    };
    let mut done = 0;
    for &mark in marks {
        let start = Instant::now();
        for _ in done..mark {
            let key = alloc.allocate(1).expect("the keyspace is far from full");
            // The implicit tree's node at depth d has 127 - d trailing zero bits.
            run.levels += u64::from(127u32.saturating_sub(key.0.trailing_zeros()));
        }
        run.stretches.push(start.elapsed());
        done = mark;
    }
    black_box(run)
}

fn ns_per_op(elapsed: Duration, ops: u64) -> f64 {
    elapsed.as_nanos() as f64 / ops as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// A group whose samples each run the whole job once: ten runs, no linear ramp.
fn group<'a>(c: &'a mut Criterion, name: &str, ops: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(ops));
    group
}

/// What one case measured.
struct Measured {
    case: String,
    marks: Vec<u64>,
    imported: u64,
    import: Duration,
    runs: Vec<Run>,
    /// Trie depth at the walk's top 1023 nodes after the first run.
    probe_depths: Vec<u32>,
}

/// Benches allocations up to `marks` on fresh clones of an allocator that `prepare` fills;
/// building, cloning, dropping and the diagnostics are not timed.
fn bench_case(
    c: &mut Criterion,
    case: &str,
    marks: Vec<u64>,
    prepare: impl FnOnce(&mut Allocator),
) -> Option<Measured> {
    let ops = *marks.last().expect("at least one mark");
    let mut prepare = Some(prepare);
    let mut base = None;
    let mut runs = Vec::new();
    let mut probe_depths = Vec::new();
    let mut group = group(c, case, ops);
    group.bench_function(format!("{ops}_allocations"), |b| {
        // Built on first use, so a case filtered out on the command line costs nothing.
        let (base, _) = base.get_or_insert_with(|| {
            let mut alloc = Allocator::new(Keyspace::KINESIS);
            let start = Instant::now();
            (prepare.take().expect("built once"))(&mut alloc);
            (alloc, start.elapsed())
        });
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut alloc = base.clone();
                let run = allocate(&mut alloc, &marks);
                total += run.stretches.iter().sum::<Duration>();
                if runs.is_empty() {
                    probe_depths = top_nodes(10).map(|x| trie_depth(&alloc, x)).collect();
                }
                runs.push(run);
            }
            total
        })
    });
    group.finish();
    let (base, import) = base?;
    Some(Measured {
        case: case.to_owned(),
        imported: base.total().count,
        marks,
        import,
        runs,
        probe_depths,
    })
}

impl Measured {
    /// The plain summary: ns per allocation overall and per stretch, import cost, depths.
    fn lines(&self) -> Vec<String> {
        let case = &self.case;
        let ops = *self.marks.last().expect("at least one mark");
        let mut lines = Vec::new();
        if self.imported > 0 {
            lines.push(format!(
                "{case}: import of {} keys took {:.2} s, {:.0} ns/key (once)",
                self.imported,
                self.import.as_secs_f64(),
                ns_per_op(self.import, self.imported)
            ));
        }
        let per_op: Vec<f64> = self
            .runs
            .iter()
            .map(|r| ns_per_op(r.stretches.iter().sum(), ops))
            .collect();
        let min = per_op.iter().copied().fold(f64::MAX, f64::min);
        let max = per_op.iter().copied().fold(0.0, f64::max);
        lines.push(format!(
            "{case}: {ops} allocations, {:.0} ns/op median (min {min:.0}, max {max:.0}, {} runs)",
            median(per_op),
            self.runs.len()
        ));
        let mut done = 0;
        for (i, &mark) in self.marks.iter().enumerate() {
            let stretch = self
                .runs
                .iter()
                .map(|r| ns_per_op(r.stretches[i], mark - done))
                .collect();
            lines.push(format!(
                "  allocations {done}..{mark}: {:.0} ns/op median",
                median(stretch)
            ));
            done = mark;
        }
        let levels: u64 = self.runs.iter().map(|r| r.levels).sum();
        let depths = &self.probe_depths;
        lines.push(format!(
            "  walk depth {:.1} levels/allocation; trie depth at the walk's top 1023 nodes: mean {:.1}, max {}",
            levels as f64 / (ops * self.runs.len() as u64) as f64,
            depths.iter().sum::<u32>() as f64 / depths.len() as f64,
            depths.iter().max().unwrap_or(&0)
        ));
        lines
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let measured = [
        bench_case(&mut c, "a_from_empty", marks(FROM_EMPTY), |_| {}),
        bench_case(&mut c, "b_after_1M_random", marks(AFTER_IMPORT), |a| {
            import_random(a, IMPORTED, 1)
        }),
        bench_case(
            &mut c,
            "c_after_1M_deep_and_random",
            marks(AFTER_IMPORT),
            |a| {
                import_powers(a);
                import_deep_chains(a);
                import_random(a, IMPORTED, 2)
            },
        ),
    ];
    c.final_summary();
    println!("\nsummary (128-bit keyspace, weight 1, time per allocation):");
    for line in measured.iter().flatten().flat_map(Measured::lines) {
        println!("{line}");
    }
}
