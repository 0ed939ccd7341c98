//! Observed load on the page: each shard's utilisation beside its keys and weight, and the
//! hot accounts with the fanout that would cool them, all as `GET /load` answers them.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::View;
use super::html::{Esc, Ratio};
use super::style::class;
use crate::http::load::LoadPage;

/// Accounts asked of `GET /load` for the page: the heaviest (`order=load`).
pub const HOT_ACCOUNTS: u32 = 10;

/// The stream's shards' utilisation, its mean, and what a full bar stands for (a shard's
/// whole write limit, or more when some shard is above it).
pub(super) struct Used<'a> {
    by_id: HashMap<&'a str, f64>,
    pub mean: f64,
    full: f64,
}

impl<'a> Used<'a> {
    /// `None` when the page shows no stream.
    pub fn of(view: &'a View) -> Option<Used<'a>> {
        let load = view.load.as_ref()?;
        let by_id: HashMap<&str, f64> = (load.shards.iter())
            .map(|s| (s.shard_id.as_str(), s.utilisation))
            .collect();
        let mean = by_id.values().sum::<f64>() / by_id.len().max(1) as f64;
        let busiest = by_id.values().copied().fold(0.0, f64::max);
        Some(Used {
            by_id,
            mean,
            full: busiest.max(1.0),
        })
    }

    /// A shard's utilisation (0 when `GET /load` does not list it).
    pub fn of_shard(&self, id: &str) -> f64 {
        self.by_id.get(id).copied().unwrap_or(0.0)
    }

    /// The cell of utilisations from `lo` to `hi` (equal for one shard): a bar coloured by
    /// its ratio to the mean, the mean marked, the figures in percent of the limit.
    pub fn cell(&self, out: &mut String, (lo, hi): (f64, f64)) {
        let pct = |u: f64| 100.0 * u / self.full;
        let _ = write!(
            out,
            "<td><div class=\"pair\"><div class=\"bar\"><i class=\"{}{}\" style=\"width:{:.1}%\"></i>",
            class(hi, self.mean),
            if lo != hi { " hi" } else { "" },
            pct(hi)
        );
        if lo != hi {
            let _ = write!(
                out,
                "<i class=\"{} lo\" style=\"width:{:.1}%\"></i>",
                class(lo, self.mean),
                pct(lo)
            );
        }
        let _ = write!(
            out,
            "<b class=\"mean\" style=\"left:{:.1}%\"></b></div><span>",
            pct(self.mean)
        );
        if lo != hi {
            let _ = write!(out, "{:.1}–", 100.0 * lo);
        }
        let _ = write!(
            out,
            "{:.1} % · {}</span></div></td>",
            100.0 * hi,
            Ratio(hi, self.mean)
        );
    }
}

/// The hot accounts: those of the heaviest by load whose load is above the hot share, with
/// their fanout now and the one `GET /load` suggests.
pub(super) fn hot_accounts(out: &mut String, view: &View) {
    out.push_str("<section id=\"hot\"><h2>Hot accounts</h2>");
    let Some(load) = &view.load else {
        out.push_str(
            "<p class=\"note\">Observed load belongs to a registered stream: choose one above.\
             </p></section>",
        );
        return;
    };
    let _ = write!(
        out,
        "<p class=\"note\">Of the {HOT_ACCOUNTS} accounts of most observed load (what consumer \
         workers report reading), those above the hot share: {:.0} % of a shard's write limit. \
         The suggested fan-out keeps each of their keys within it.</p>",
        100.0 * view.hot_share
    );
    let hot: Vec<_> = (load.accounts.iter())
        .filter(|a| a.suggested_fanout.is_some())
        .collect();
    if hot.is_empty() {
        out.push_str("<p>No account is hot.</p></section>");
        return;
    }
    out.push_str(
        "<table><thead><tr><th>Account</th><th class=\"n\">Load (of a shard)</th>\
         <th class=\"n\">Records/s</th><th class=\"n\">Fan-out</th>\
         <th class=\"n\">Suggested fan-out</th></tr></thead><tbody>",
    );
    for a in &hot {
        let fanout = a.fanout.map_or(String::from("–"), |f| f.to_string());
        let suggested = a.suggested_fanout.unwrap_or(1);
        let _ = write!(
            out,
            "<tr data-hot-account=\"{0}\" data-load=\"{1}\" data-current-fanout=\"{2}\" \
             data-suggested-fanout=\"{3}\"><td class=\"acct\">{0}</td><td class=\"n\">{4:.1} %\
             </td><td class=\"n\">{5:.1}</td><td class=\"n\">{2}</td><td class=\"n\"><b>{3}</b>\
             </td></tr>",
            Esc(&a.account),
            a.load,
            fanout,
            suggested,
            100.0 * a.load,
            a.records_per_s,
        );
    }
    out.push_str("</tbody></table>");
    if hot.len() == HOT_ACCOUNTS as usize {
        let _ = write!(
            out,
            "<p class=\"note\">More may follow: GET /load?stream={}&amp;order=load&amp;limit=1000 \
             lists the heaviest accounts.</p>",
            Esc(&load.stream)
        );
    }
    out.push_str("</section>");
}

/// `GET /load` of `stream`: its shards and its heaviest accounts.
pub(super) async fn of_stream(
    state: &crate::AppState,
    stream: &str,
) -> Result<LoadPage, crate::http::error::ApiError> {
    let params = crate::http::load::LoadParams {
        stream: stream.to_owned(),
        order: Some("load".to_owned()),
        after: None,
        limit: Some(HOT_ACCOUNTS),
    };
    let page = crate::http::load::load(
        axum::extract::State(state.clone()),
        axum::extract::Query(params),
    )
    .await?;
    Ok(page.0)
}
