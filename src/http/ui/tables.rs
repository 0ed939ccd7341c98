//! Pending moves with their switch time, and the consumer workers with their leases.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::View;
use super::band::short_id;
use super::html::{Esc, Num, Ratio, Until};
use crate::http::leases::ShardLeaseState;

/// Workers listed; the rest are counted.
pub const WORKERS_SHOWN: usize = 50;
/// Leases shown per worker; the rest are counted.
pub const LEASES_SHOWN: usize = 12;

pub(super) fn moves(out: &mut String, view: &View) {
    let page = &view.moves;
    let _ = write!(
        out,
        "<section id=\"moves\"><h2>Pending moves</h2><p class=\"note\">Keys a rebalance moved \
         that have not switched yet: producers send the old key until the switch, the new one \
         from then on. Shards are this map's; the oldest {} moves first.</p>",
        super::MOVES_SHOWN
    );
    if page.items.is_empty() {
        out.push_str("<p>No move is pending.</p></section>");
        return;
    }
    out.push_str(
        "<table><thead><tr><th>Account</th><th class=\"n\">Key</th><th>Shard</th>\
         <th>Switches at (UTC)</th><th>Applied at (UTC)</th><th>Applied by</th><th>Why</th></tr>\
         </thead><tbody>",
    );
    for m in &page.items {
        let shard = |key| short_id(&view.distribution.shards[view.map.index_of(key)].shard_id);
        let switch_ms = time::OffsetDateTime::parse(
            &m.switch_at,
            &time::format_description::well_known::Rfc3339,
        )
        .map_or(view.now, |t| (t.unix_timestamp_nanos() / 1_000_000) as i64);
        let why = m.reason.map_or("", |r| r.as_str());
        let _ = write!(
            out,
            "<tr data-event-id=\"{}\" data-account=\"{}\" data-index=\"{}\" data-from=\"{}\" \
             data-to=\"{}\" data-switch-at=\"{}\" data-applied-by=\"{}\" data-reason=\"{why}\">\
             <td class=\"acct\">{}</td><td class=\"n\">{}</td><td>{} → {}</td>\
             <td>{} <span class=\"state\">({})</span></td><td>{}</td><td>{}</td><td>{why}</td></tr>",
            m.event_id,
            Esc(&m.account),
            m.index,
            m.from.0,
            m.to.0,
            Esc(&m.switch_at),
            Esc(&m.applied_by),
            Esc(&m.account),
            m.index,
            Esc(shard(m.from)),
            Esc(shard(m.to)),
            Esc(&m.switch_at),
            Until(switch_ms - view.now),
            Esc(&m.applied_at),
            Esc(&m.applied_by),
        );
    }
    out.push_str("</tbody></table>");
    if let Some(after) = page.next {
        let _ = write!(
            out,
            "<p class=\"note\">More follow: <a href=\"/moves?after={after}\">/moves?after={after}</a></p>"
        );
    }
    out.push_str("</section>");
}

pub(super) fn workers(out: &mut String, view: &View) {
    out.push_str("<section id=\"workers\"><h2>Workers and leases</h2>");
    let Some(leases) = &view.leases else {
        out.push_str(
            "<p class=\"note\">Consumer leases belong to a registered stream: choose one above.</p>\
             </section>",
        );
        return;
    };
    let mut counts: [(ShardLeaseState, &str, u64); 5] = [
        (ShardLeaseState::Held, "held", 0),
        (ShardLeaseState::Revoking, "revoking", 0),
        (ShardLeaseState::Free, "free", 0),
        (ShardLeaseState::Waiting, "waiting", 0),
        (ShardLeaseState::Done, "done", 0),
    ];
    let mut state = HashMap::with_capacity(leases.shards.len());
    for s in &leases.shards {
        state.insert(s.shard_id.as_str(), s.state);
        counts
            .iter_mut()
            .filter(|c| c.0 == s.state)
            .for_each(|c| c.2 += 1);
    }
    let _ = write!(out, "<p class=\"note\" id=\"lease-states\"");
    for (_, name, n) in &counts {
        let _ = write!(out, " data-{name}=\"{n}\"");
    }
    let _ = write!(out, ">{} shards to read:", Num(leases.shards.len() as u64));
    for (_, name, n) in &counts {
        let _ = write!(out, " {} {name},", Num(*n));
    }
    out.pop();
    let total: u64 = leases.workers.iter().map(|w| w.weight).sum();
    let mean = total as f64 / leases.workers.len().max(1) as f64;
    let _ = write!(
        out,
        ". A worker's weight is its shards'; the line marks the mean over the {} live workers \
         ({:.1}). Its utilisation is its shards' observed load: once workers report it, leases \
         are balanced by it instead.</p>",
        leases.workers.len(),
        mean
    );
    if leases.workers.is_empty() {
        out.push_str("<p>No worker is live.</p></section>");
        return;
    }
    out.push_str(
        "<table><thead><tr><th>Worker</th><th class=\"n\">Shards</th><th style=\"width:30%\">\
         Weight</th><th class=\"n\">Utilisation</th><th>Expires at (UTC)</th><th>Leases (shard, dashed: revoking)</th></tr>\
         </thead><tbody>",
    );
    let heaviest = leases.workers.iter().map(|w| w.weight).max().unwrap_or(0);
    let full = (2.0 * mean).max(heaviest as f64).max(1.0);
    for w in leases.workers.iter().take(WORKERS_SHOWN) {
        let _ = write!(
            out,
            "<tr data-worker=\"{0}\" data-shards=\"{1}\" data-weight=\"{2}\" data-expires-at=\"{3}\" \
             data-worker-utilisation=\"{8}\"><td class=\"acct\">{0}</td><td class=\"n\">{1}</td>\
             <td><div class=\"pair\"><div class=\"bar\"><i class=\"ks\" style=\"width:{4:.1}%\">\
             </i><b class=\"mean\" style=\"left:{5:.1}%\"></b></div><span>{6} · {7}</span></div>\
             </td><td class=\"n\">{9:.1} %</td><td>{3}</td><td>",
            Esc(&w.worker),
            w.shards.len(),
            w.weight,
            Esc(&w.expires_at),
            100.0 * w.weight as f64 / full,
            100.0 * mean / full,
            Num(w.weight),
            Ratio(w.weight as f64, mean),
            w.utilisation,
            100.0 * w.utilisation,
        );
        for id in w.shards.iter().take(LEASES_SHOWN) {
            let revoking = state.get(id.as_str()) == Some(&ShardLeaseState::Revoking);
            let _ = write!(
                out,
                "<span class=\"key{}\" data-lease=\"{}\" title=\"{}\">{}</span>",
                if revoking { " next" } else { "" },
                Esc(id),
                Esc(id),
                Esc(short_id(id))
            );
        }
        if w.shards.len() > LEASES_SHOWN {
            let _ = write!(out, "… {} more", w.shards.len() - LEASES_SHOWN);
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</tbody></table>");
    if leases.workers.len() > WORKERS_SHOWN {
        let _ = write!(
            out,
            "<p class=\"note\">{} more workers: GET /streams/{{name}}/leases lists them all.</p>",
            leases.workers.len() - WORKERS_SHOWN
        );
    }
    out.push_str("</section>");
}
