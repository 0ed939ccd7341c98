//! Observed load: rates smoothed exponentially with a half-life, and how much of a shard's
//! write limit they use.
//!
//! A rate is stored with the instant it was last folded at and decays from there with the
//! clock, so a rate read later is the same whoever reads it and whenever it was written.

/// A shard's write limit: Kinesis takes 1,000 records/s and 1 MiB/s per shard.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub records_per_s: f64,
    pub bytes_per_s: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            records_per_s: 1000.0,
            bytes_per_s: 1_048_576.0,
        }
    }
}

/// Records and bytes per second, as of `at_ms` (Unix milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rate {
    pub records_per_s: f64,
    pub bytes_per_s: f64,
    pub at_ms: i64,
}

/// What is left after `elapsed_ms` of decay with `half_life_ms`: 2^(-elapsed / half-life),
/// 1 when no time passed (or the clock went back).
pub fn decay(elapsed_ms: i64, half_life_ms: i64) -> f64 {
    if elapsed_ms <= 0 {
        return 1.0;
    }
    (-(elapsed_ms as f64) / half_life_ms.max(1) as f64).exp2()
}

impl Rate {
    /// The rate as of `now_ms`: decayed by 2^(-(now_ms - at_ms) / half_life_ms) (never
    /// negative). A `now_ms` before `at_ms` (a clock stepped back) leaves it as it is.
    pub fn at(self, now_ms: i64, half_life_ms: i64) -> Rate {
        let left = decay(now_ms - self.at_ms, half_life_ms);
        Rate {
            records_per_s: (self.records_per_s * left).max(0.0),
            bytes_per_s: (self.bytes_per_s * left).max(0.0),
            at_ms: now_ms.max(self.at_ms),
        }
    }

    /// Folds in a report of `records`/`bytes` read over `window_ms` ending at `now_ms`:
    /// self.at(now) + observed_rate * (1 - 2^(-window_ms / half_life_ms)). Reports every
    /// `window_ms` of a steady rate r bring the rate to r; a window of no time adds nothing.
    pub fn observe(
        self,
        records: u64,
        bytes: u64,
        window_ms: i64,
        now_ms: i64,
        half_life_ms: i64,
    ) -> Rate {
        let mut rate = self.at(now_ms, half_life_ms);
        if window_ms > 0 {
            let seconds = window_ms as f64 / 1000.0;
            let share = 1.0 - decay(window_ms, half_life_ms);
            rate.records_per_s += records as f64 / seconds * share;
            rate.bytes_per_s += bytes as f64 / seconds * share;
        }
        rate
    }

    /// The share of a shard's write limit this rate uses: the larger of records/s over
    /// the records limit and bytes/s over the bytes limit.
    /// The rate at `now_ms` of a shard (or one of its accounts) whose rates are current
    /// for `held_ms` after its last report (see [`held_ms`]) and decay with the clock after
    /// that.
    pub fn held(self, now_ms: i64, held_ms: i64, half_life_ms: i64) -> Rate {
        Rate {
            at_ms: now_ms.max(self.at_ms),
            ..self.at(now_ms - held_ms.max(0), half_life_ms)
        }
    }

    pub fn utilisation(&self, limits: Limits) -> f64 {
        (self.records_per_s / limits.records_per_s).max(self.bytes_per_s / limits.bytes_per_s)
    }

    /// The rate summed with `other`, both as of `now_ms`.
    pub fn plus(self, other: Rate, now_ms: i64, half_life_ms: i64) -> Rate {
        let (a, b) = (
            self.at(now_ms, half_life_ms),
            other.at(now_ms, half_life_ms),
        );
        Rate {
            records_per_s: a.records_per_s + b.records_per_s,
            bytes_per_s: a.bytes_per_s + b.bytes_per_s,
            at_ms: a.at_ms.max(b.at_ms),
        }
    }
}

/// How long a shard's rates stay current after its last report (at `reported_ms`, covering
/// `window_ms`) when the stream's newest report came at `latest_ms`: until the next report
/// is due, one window later, or the newest report if sooner. So every shard that reports
/// reads as of the stream's newest report and all of them decay together from there; one
/// whose reports stopped decays from one window after its last. Decayed each from its own
/// report instead, shards reported a moment ago would outweigh shards about to report by
/// up to 2^(window / half-life) at one steady rate, and plans would follow the phase of the
/// workers' heartbeats.
pub fn held_ms(reported_ms: i64, window_ms: i64, latest_ms: i64) -> i64 {
    window_ms.min(latest_ms - reported_ms).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR: i64 = 3_600_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn a_report_folds_in_as_the_formula_says() {
        let hl = 120_000;
        let first = Rate::default().observe(600, 60_000, 60_000, 1_000_000, hl);
        let share = 1.0 - 0.5f64.sqrt();
        assert!(close(first.records_per_s, 10.0 * share), "{first:?}");
        assert!(close(first.bytes_per_s, 1000.0 * share), "{first:?}");
        assert_eq!(first.at_ms, 1_000_000);
        let second = first.observe(0, 0, 60_000, 1_120_000, hl);
        assert!(close(second.records_per_s, first.records_per_s / 2.0));
        let limits = Limits::default();
        let u = Rate {
            records_per_s: 500.0,
            bytes_per_s: 1_048_576.0,
            at_ms: 0,
        }
        .utilisation(limits);
        assert!(close(u, 1.0));
    }

    fn rate() -> impl Strategy<Value = Rate> {
        (0.0..1e9f64, 0.0..1e12f64, -HOUR..HOUR).prop_map(|(r, b, at)| Rate {
            records_per_s: r,
            bytes_per_s: b,
            at_ms: at,
        })
    }

    proptest! {
        /// Decay never raises a rate, never makes one negative, and halves it per
        /// half-life.
        #[test]
        fn decay_is_monotone_and_halves_per_half_life(
            rate in rate(), hl in 1i64..=86_400_000, a in 0i64..HOUR, b in 0i64..HOUR,
        ) {
            let (early, late) = (rate.at_ms + a.min(b), rate.at_ms + a.max(b));
            let (x, y) = (rate.at(early, hl), rate.at(late, hl));
            prop_assert!(y.records_per_s <= x.records_per_s && y.bytes_per_s <= x.bytes_per_s);
            prop_assert!(y.records_per_s >= 0.0 && y.bytes_per_s >= 0.0);
            let half = rate.at(rate.at_ms + hl, hl);
            prop_assert!(close(half.records_per_s, rate.records_per_s / 2.0));
            prop_assert!(close(half.bytes_per_s, rate.bytes_per_s / 2.0));
            // Decaying in two steps is decaying once.
            let twice = x.at(late, hl);
            prop_assert!(close(twice.records_per_s, y.records_per_s));
        }

        /// Reports of any size never make a rate negative; observing nothing is decaying.
        #[test]
        fn no_negative_rates_and_observing_nothing_is_decaying(
            rate in rate(), records: u64, bytes: u64, window in 1i64..=HOUR,
            later in 0i64..HOUR, hl in 1i64..=86_400_000,
        ) {
            let now = rate.at_ms + later;
            let seen = rate.observe(records, bytes, window, now, hl);
            prop_assert!(seen.records_per_s >= 0.0 && seen.bytes_per_s >= 0.0);
            prop_assert!(seen.utilisation(Limits::default()) >= 0.0);
            prop_assert_eq!(rate.observe(0, 0, window, now, hl), rate.at(now, hl));
        }

        /// Two shards at one steady rate read the same whenever each reported within a
        /// window of the stream's newest report, and decay together from it; a shard whose
        /// reports stopped decays from one window after its last.
        #[test]
        fn shards_reported_within_a_window_read_as_of_the_newest_report(
            rate in rate(), window in 1i64..=HOUR, gap in 0i64..HOUR, later in 0i64..HOUR,
            hl in 1i64..=86_400_000,
        ) {
            let first = rate.at_ms;
            let latest = first + gap;
            let now = latest + later;
            // The second shard reported at `latest` with the same figures.
            let second = Rate { at_ms: latest, ..rate };
            let a = rate.held(now, held_ms(first, window, latest), hl);
            let b = second.held(now, held_ms(latest, window, latest), hl);
            prop_assert_eq!(b, second.at(now, hl));
            if gap <= window {
                prop_assert!(close(a.records_per_s, b.records_per_s), "{a:?} {b:?}");
                prop_assert!(close(a.bytes_per_s, b.bytes_per_s));
            } else {
                let decayed = rate.at(now - window, hl);
                prop_assert!(close(a.records_per_s, decayed.records_per_s), "{a:?} {decayed:?}");
                prop_assert!(a.records_per_s <= b.records_per_s);
            }
            prop_assert_eq!(a.at_ms, now);
        }

        /// A steady stream of reports at rate r brings any starting rate to r.
        #[test]
        fn a_steady_report_stream_converges_to_its_rate(
            start in rate(), per_s in 0u64..100_000, window in 1_000i64..=60_000,
            hl in 1_000i64..=600_000,
        ) {
            let mut rate = start;
            let mut now = start.at_ms;
            // 60 half-lives: what is left of the start is 2^-60 of it.
            let reports = (60 * hl / window + 1) as usize;
            let records = per_s * window as u64 / 1000;
            for _ in 0..reports {
                now += window;
                rate = rate.observe(records, records * 100, window, now, hl);
            }
            let r = records as f64 * 1000.0 / window as f64;
            prop_assert!((rate.records_per_s - r).abs() <= 1e-6 * r.max(1.0), "{rate:?} vs {r}");
            prop_assert!((rate.bytes_per_s - 100.0 * r).abs() <= 1e-6 * (100.0 * r).max(1.0));
        }
    }
}
