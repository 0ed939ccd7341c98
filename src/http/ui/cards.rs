//! The headline figures at the top of the page: totals and skew, keyspread's beside MD5's.

use std::fmt::Write as _;

use super::View;
use super::html::{Esc, Num, Ratio};
use crate::keyspace::Skew;

/// The headline figures: totals and skew, keyspread's beside MD5's.
pub(super) fn write(out: &mut String, view: &View) {
    let d = &view.distribution;
    let mean = d.skew.weight as f64 / d.skew.shards.max(1) as f64;
    out.push_str("<div class=\"cards\">");
    card(out, ("shards", "Shards"), d.skew.shards, "on this map");
    card(
        out,
        ("accounts", "Accounts"),
        view.accounts as u64,
        "holding keys",
    );
    card(
        out,
        ("keys", "Keys"),
        d.skew.accounts,
        "K for an account of fan-out K",
    );
    card(
        out,
        ("weight", "Weight"),
        d.skew.weight,
        &format!("{mean:.1} per shard on average"),
    );
    skew_card(out, "skew", "keyspread skew", &d.skew);
    skew_card(out, "md5-skew", "MD5 skew", &d.md5_skew);
    card(
        out,
        ("pending", "Pending moves"),
        view.switching as u64,
        "keys not switched yet",
    );
    if let Some(leases) = &view.leases {
        card(
            out,
            ("workers", "Workers"),
            leases.workers.len() as u64,
            "live, reading this stream",
        );
    }
    out.push_str("</div>");
}

fn card(out: &mut String, (id, label): (&str, &str), value: u64, what: &str) {
    let _ = write!(
        out,
        "<div class=\"card\" id=\"card-{id}\" data-value=\"{value}\"><span class=\"label\">{label}\
         </span><b>{}</b><span>{}</span></div>",
        Num(value),
        Esc(what)
    );
}

/// Heaviest shard over the mean, by keys and by weight, with the raw figures to check.
fn skew_card(out: &mut String, id: &str, label: &str, s: &Skew) {
    let mean_weight = s.weight as f64 / s.shards.max(1) as f64;
    let _ = write!(
        out,
        "<div class=\"card\" id=\"{id}\" data-shards=\"{}\" data-keys=\"{}\" data-max=\"{}\" \
         data-min=\"{}\" data-max-over-mean=\"{}\" data-weight=\"{}\" data-max-weight=\"{}\" \
         data-min-weight=\"{}\"><span class=\"label\">{label}</span><b>{:.2}× <small>keys</small>\
         </b><b>{} <small>weight</small></b><span>heaviest shard ÷ mean</span></div>",
        s.shards,
        s.accounts,
        s.max,
        s.min,
        s.max_over_mean,
        s.weight,
        s.max_weight,
        s.min_weight,
        s.max_over_mean,
        Ratio(s.max_weight as f64, mean_weight),
    );
}
