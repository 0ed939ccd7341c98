//! The heaviest accounts, with each key and the shard it lands on.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::View;
use super::band::short_id;
use super::html::{Esc, Num};
use crate::keyspace::HashKey;

/// Keys shown per account; the rest are counted.
pub const KEYS_SHOWN: usize = 32;

pub(super) fn write(out: &mut String, view: &View) {
    let total = view.distribution.skew.weight.max(1) as f64;
    let _ = write!(
        out,
        "<section id=\"accounts\"><h2>Heaviest accounts</h2><p class=\"note\">The {} accounts of \
         most weight, as lookups answer them now: each key (index → shard on this map). A hot \
         account's keys should lie on distinct shards.</p>",
        view.heaviest.len()
    );
    if view.heaviest.is_empty() {
        out.push_str("<p>No account holds a key yet.</p></section>");
        return;
    }
    out.push_str(
        "<table><thead><tr><th class=\"n\">#</th><th>Account</th><th class=\"n\">Weight</th>\
         <th class=\"n\">Share</th><th class=\"n\">Fan-out</th><th class=\"n\">Shards</th>\
         <th>Keys: index → shard</th></tr></thead><tbody>",
    );
    for (rank, a) in view.heaviest.iter().enumerate() {
        let shards: Vec<usize> = a.hash_keys.iter().map(|k| view.map.index_of(*k)).collect();
        let distinct = shards.iter().collect::<BTreeSet<_>>().len();
        let _ = write!(
            out,
            "<tr data-account=\"{0}\" data-weight=\"{1}\" data-fanout=\"{2}\">\
             <td class=\"n\">{3}</td><td class=\"acct\">{0}</td><td class=\"n\">{4}</td>\
             <td class=\"n\">{5:.1} %</td><td class=\"n\">{2}</td><td class=\"n\">{6}</td><td>",
            Esc(&a.account),
            a.weight,
            a.fanout,
            rank + 1,
            Num(a.weight),
            100.0 * a.weight as f64 / total,
            distinct,
        );
        for (index, (key, shard)) in a.hash_keys.iter().zip(&shards).enumerate().take(KEYS_SHOWN) {
            key_chip(out, view, "key", index, *key, *shard);
        }
        if a.hash_keys.len() > KEYS_SHOWN {
            let _ = write!(out, "… {} more", a.hash_keys.len() - KEYS_SHOWN);
        }
        if let Some(next) = &a.next {
            let _ = write!(
                out,
                "<br><span class=\"state\">from {}:</span> ",
                Esc(&next.switch_at)
            );
            let moved = a.hash_keys.iter().zip(&next.hash_keys).enumerate();
            for (index, (_, to)) in moved.filter(|(_, (now, to))| now != to) {
                key_chip(out, view, "key next", index, *to, view.map.index_of(*to));
            }
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</tbody></table></section>");
}

/// One key: its index and shard, with the hash key itself to hover over and to check.
fn key_chip(out: &mut String, view: &View, class: &str, index: usize, key: HashKey, shard: usize) {
    let id = &view.distribution.shards[shard].shard_id;
    let _ = write!(
        out,
        "<span class=\"{class}\" data-index=\"{index}\" data-hash-key=\"{}\" data-shard=\"{shard}\" \
         title=\"key {index}: hash key {}, shard {}\">{index} → {}</span>",
        key.0,
        key.0,
        Esc(id),
        Esc(short_id(id))
    );
}
