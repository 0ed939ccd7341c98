//! A bar per shard for its keys and its weight against the mean, keyspread's beside what
//! MD5 of the account names would give; a larger map in rows of adjacent shards, with its
//! heaviest shards listed one by one. On a stream, each shard's observed utilisation
//! beside them.

use std::fmt::Write as _;

use super::View;
use super::band::{group_size, short_id};
use super::html::{Esc, Num, Ratio};
use super::load::Used;
use crate::http::shards::ShardLoad;

/// Most rows the table has: adjacent shards of a larger map share one.
pub const MAX_ROWS: usize = 64;
/// Shards listed one by one under a table of grouped rows.
pub const HEAVIEST_SHARDS: usize = 8;

/// One measure (keys, or weight) over the map: its mean, and the value a full bar stands
/// for (twice the mean, or more when some shard, by either method, is heavier).
struct Scale {
    mean: f64,
    full: f64,
}

impl Scale {
    fn of(shards: &[ShardLoad], ks: fn(&ShardLoad) -> u64, md5: fn(&ShardLoad) -> u64) -> Scale {
        let mean = shards.iter().map(ks).sum::<u64>() as f64 / shards.len().max(1) as f64;
        let most = shards.iter().map(|s| ks(s).max(md5(s))).max().unwrap_or(0);
        Scale {
            mean,
            full: (2.0 * mean).max(most as f64).max(1.0),
        }
    }

    fn percent(&self, value: f64) -> f64 {
        100.0 * value / self.full
    }
}

pub(super) fn write(out: &mut String, view: &View) {
    let shards = &view.distribution.shards;
    let group = group_size(shards.len(), MAX_ROWS);
    let keys = Scale::of(shards, |s| s.accounts, |s| s.md5_accounts);
    let weight = Scale::of(shards, |s| s.weight, |s| s.md5_weight);
    let used = Used::of(view);
    let _ = write!(
        out,
        "<section id=\"shards\"><h2>Shards: keys and weight against the mean</h2>\
         <p class=\"note\">Mean per shard: {:.1} keys, {:.1} weight. Each cell: keyspread's keys \
         above, what MD5 of the account names would give below (had producers sent the names as \
         partition keys); the black line marks the mean.",
        keys.mean, weight.mean
    );
    if let Some(used) = &used {
        let _ = write!(
            out,
            " Utilisation: what consumer workers report reading, of the shard's write limit \
             (mean {:.1} %), coloured by its ratio to the mean.",
            100.0 * used.mean
        );
    }
    if group > 1 {
        let _ = write!(
            out,
            " Each row is {group} adjacent shards: a bar reaches the heaviest of them, its dark \
             part the lightest; figures read lightest–heaviest."
        );
    }
    out.push_str(
        "</p><div class=\"legend\"><span><i style=\"background:var(--ks)\"></i>keyspread</span>\
         <span><i style=\"background:var(--md5)\"></i>MD5 of the names</span>\
         <span><i style=\"background:var(--ink);width:2px\"></i>mean</span></div>",
    );
    let used = used.as_ref();
    table_head(out, if group > 1 { "Shards" } else { "Shard" }, used);
    if group == 1 {
        shards
            .iter()
            .for_each(|s| shard_row(out, s, &keys, &weight, used));
    } else {
        shards
            .chunks(group)
            .for_each(|part| group_row(out, part, &keys, &weight, used));
        let _ = write!(
            out,
            "</tbody></table><h3>The {HEAVIEST_SHARDS} heaviest shards</h3>"
        );
        table_head(out, "Shard", used);
        let mut heaviest: Vec<&ShardLoad> = shards.iter().collect();
        heaviest.sort_by_key(|s| (std::cmp::Reverse(s.weight), s.shard_index));
        for s in heaviest.into_iter().take(HEAVIEST_SHARDS) {
            shard_row(out, s, &keys, &weight, used);
        }
    }
    out.push_str("</tbody></table></section>");
}

fn table_head(out: &mut String, first: &str, used: Option<&Used>) {
    let _ = write!(
        out,
        "<table><thead><tr><th style=\"width:12%\">{first}</th><th>Keys</th><th>Weight</th>{}\
         </tr></thead><tbody>",
        if used.is_some() {
            "<th>Utilisation (observed)</th>"
        } else {
            ""
        }
    );
}

fn shard_row(out: &mut String, s: &ShardLoad, keys: &Scale, weight: &Scale, used: Option<&Used>) {
    let utilisation = used.map(|u| u.of_shard(&s.shard_id));
    let _ = write!(out, "<tr data-shard-id=\"{}\"", Esc(&s.shard_id));
    if let Some(u) = utilisation {
        let _ = write!(out, " data-utilisation=\"{u}\"");
    }
    let _ = write!(
        out,
        " data-shard=\"{}\" data-keys=\"{}\" data-weight=\"{}\" data-md5-keys=\"{}\" \
         data-md5-weight=\"{}\"><td title=\"{}\"><b>{}</b></td>",
        s.shard_index,
        s.accounts,
        s.weight,
        s.md5_accounts,
        s.md5_weight,
        Esc(&s.shard_id),
        Esc(short_id(&s.shard_id)),
    );
    let one = |v: u64| (v, v);
    cell(out, keys, one(s.accounts), one(s.md5_accounts));
    cell(out, weight, one(s.weight), one(s.md5_weight));
    if let (Some(used), Some(u)) = (used, utilisation) {
        used.cell(out, (u, u));
    }
    out.push_str("</tr>");
}

fn group_row(
    out: &mut String,
    part: &[ShardLoad],
    keys: &Scale,
    weight: &Scale,
    used: Option<&Used>,
) {
    let (Some(first), Some(last)) = (part.first(), part.last()) else {
        return;
    };
    let utilisation = used.map(|used| {
        let values = part.iter().map(|s| used.of_shard(&s.shard_id));
        let lo = values.clone().fold(f64::INFINITY, f64::min);
        (lo, values.fold(0.0, f64::max))
    });
    out.push_str("<tr");
    if let Some((lo, hi)) = utilisation {
        let _ = write!(
            out,
            " data-min-utilisation=\"{lo}\" data-max-utilisation=\"{hi}\""
        );
    }
    let range = |f: fn(&ShardLoad) -> u64| {
        let values = part.iter().map(f);
        (values.clone().min().unwrap_or(0), values.max().unwrap_or(0))
    };
    let (k, w) = (range(|s| s.accounts), range(|s| s.weight));
    let (mk, mw) = (range(|s| s.md5_accounts), range(|s| s.md5_weight));
    let _ = write!(
        out,
        " data-first=\"{}\" data-last=\"{}\" data-min-keys=\"{}\" data-max-keys=\"{}\" \
         data-min-weight=\"{}\" data-max-weight=\"{}\" data-md5-min-keys=\"{}\" \
         data-md5-max-keys=\"{}\" data-md5-min-weight=\"{}\" data-md5-max-weight=\"{}\">\
         <td><b>{}–{}</b></td>",
        first.shard_index,
        last.shard_index,
        k.0,
        k.1,
        w.0,
        w.1,
        mk.0,
        mk.1,
        mw.0,
        mw.1,
        Esc(short_id(&first.shard_id)),
        Esc(short_id(&last.shard_id)),
    );
    cell(out, keys, k, mk);
    cell(out, weight, w, mw);
    if let (Some(used), Some(range)) = (used, utilisation) {
        used.cell(out, range);
    }
    out.push_str("</tr>");
}

/// keyspread's bar above MD5's, each with its figures: `(lightest, heaviest)`.
fn cell(out: &mut String, scale: &Scale, ks: (u64, u64), md5: (u64, u64)) {
    out.push_str("<td><div class=\"pair\">");
    bar(out, scale, "ks", ks);
    bar(out, scale, "md5", md5);
    out.push_str("</div></td>");
}

fn bar(out: &mut String, scale: &Scale, kind: &str, (lo, hi): (u64, u64)) {
    let pct = |v: u64| scale.percent(v as f64);
    out.push_str("<div class=\"bar\">");
    if lo == hi {
        let _ = write!(
            out,
            "<i class=\"{kind}\" style=\"width:{:.1}%\"></i>",
            pct(hi)
        );
    } else {
        let _ = write!(
            out,
            "<i class=\"{kind} hi\" style=\"width:{:.1}%\"></i>\
             <i class=\"{kind} lo\" style=\"width:{:.1}%\"></i>",
            pct(hi),
            pct(lo)
        );
    }
    let _ = write!(
        out,
        "<b class=\"mean\" style=\"left:{:.1}%\"></b></div><span>",
        scale.percent(scale.mean)
    );
    if lo != hi {
        let _ = write!(out, "{}–", Num(lo));
    }
    let _ = write!(out, "{} · {}</span>", Num(hi), Ratio(hi as f64, scale.mean));
}
