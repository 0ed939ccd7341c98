//! What the benchmarks share.

/// splitmix64: a fixed-seed generator, so every run imports the same keys.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[allow(dead_code)] // not every bench draws 128-bit keys
    pub fn next_u128(&mut self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }
}

/// The number after the command-line flag `name`, or `default`.
#[allow(dead_code)] // for the benches that take flags of this shape
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    (args.iter().position(|a| a == name))
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

/// Each of `accounts` accounts' load, in shards' capacities: Zipf(1.1) by a random rank,
/// all together `fill` of `shards` shards' capacity.
#[allow(dead_code)] // for the benches of load
pub fn zipf_loads(accounts: usize, shards: u64, fill: f64, rng: &mut SplitMix64) -> Vec<f64> {
    let mut ranks: Vec<usize> = (1..=accounts).collect();
    for i in (1..ranks.len()).rev() {
        ranks.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let harmonic: f64 = (1..=accounts).map(|r| (r as f64).powf(-1.1)).sum();
    let scale = fill * shards as f64 / harmonic;
    ranks
        .into_iter()
        .map(|rank| scale * (rank as f64).powf(-1.1))
        .collect()
}
