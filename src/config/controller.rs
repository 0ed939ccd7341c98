//! `--auto-rebalance` and the flags that steer the load controller (src/registry/controller.rs).

/// `--auto-rebalance` and the flags that steer it.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerConfig {
    /// Balance the primary stream by observed load: every interval, apply a by-load plan
    /// when its busiest shard is above the tolerance band and the floor.
    #[arg(long, env = "KEYSPREAD_AUTO_REBALANCE")]
    pub auto_rebalance: bool,
    /// Seconds between the controller's rounds (1..=86400).
    #[arg(long, env = "KEYSPREAD_AUTO_REBALANCE_INTERVAL_S", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub auto_rebalance_interval_s: u64,
    /// The band: a round acts only when the busiest shard's utilisation is above
    /// (1 + this) × the mean (0..=10).
    #[arg(long, env = "KEYSPREAD_LOAD_TOLERANCE", default_value_t = 0.10,
          value_parser = fraction(10.0))]
    pub load_tolerance: f64,
    /// A round acts only when the busiest shard's utilisation is above this (0..=100):
    /// a quiet stream is left alone however uneven.
    #[arg(long, env = "KEYSPREAD_LOAD_FLOOR", default_value_t = 0.05,
          value_parser = fraction(100.0))]
    pub load_floor: f64,
    /// Most moves one round makes; default 1 % of the accounts, at least 1.
    #[arg(long, env = "KEYSPREAD_MAX_MOVES_PER_ROUND",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_moves_per_round: Option<u64>,
    /// Seconds after the controller moved an account before it may move it again.
    #[arg(long, env = "KEYSPREAD_MOVE_COOLDOWN_S", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    pub move_cooldown_s: u64,
    /// Milliseconds from a round to its moves' switch; unset, the lookup answers' lifetime
    /// (`--lookup-cache-control`), so that no cached answer outlives an old key.
    #[arg(skip)]
    pub switch_after_ms: Option<i64>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            auto_rebalance: false,
            auto_rebalance_interval_s: 60,
            load_tolerance: 0.10,
            load_floor: 0.05,
            max_moves_per_round: None,
            move_cooldown_s: 600,
            switch_after_ms: None,
        }
    }
}

/// A parser of finite numbers in `0..=max`.
fn fraction(max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value: f64 = text
            .parse()
            .map_err(|_| format!("{text:?} is not a number"))?;
        if value.is_finite() && (0.0..=max).contains(&value) {
            Ok(value)
        } else {
            Err(format!("must be between 0 and {max}, got {value}"))
        }
    }
}
