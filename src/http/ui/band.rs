//! The keyspace as a band: each shard's hash-key range as wide as it is, coloured by its
//! weight against the mean; keyspread's keys above, MD5 of the names below.

use std::fmt::Write as _;

use super::View;
use super::html::{Esc, Num, Ratio};
use super::style::{CLASSES, class};
use crate::http::shards::ShardLoad;

/// Most segments a band is drawn with: adjacent shards of a larger map share one,
/// coloured by the heaviest of them.
pub const MAX_SEGMENTS: usize = 128;
/// Which weight of a shard a band shows: keyspread's, or MD5's.
type Weigh = fn(&ShardLoad) -> u64;

/// Most shards whose names fit inside their segments.
const NAMED_SEGMENTS: usize = 24;

/// Shards per segment (or per row) so that `shards` fit in `most`.
pub fn group_size(shards: usize, most: usize) -> usize {
    shards.div_ceil(most).max(1)
}

/// A shard's short name: the number of a Kinesis shard id without its zeros
/// (`shardId-000000000007` is `7`), any other id as it is.
pub fn short_id(id: &str) -> &str {
    match id.strip_prefix("shardId-") {
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            let trimmed = digits.trim_start_matches('0');
            if trimmed.is_empty() { "0" } else { trimmed }
        }
        _ => id,
    }
}

pub(super) fn write(out: &mut String, view: &View) {
    let shards = &view.distribution.shards;
    let group = group_size(shards.len(), MAX_SEGMENTS);
    out.push_str(
        "<section id=\"keyspace\"><h2>Keyspace</h2><p class=\"note\">Hash keys from 0 \
                  (left) to 2<sup>128</sup> − 1 (right), cut into the shards' ranges; each \
                  range coloured by its weight against the mean shard weight.",
    );
    if group > 1 {
        let _ = write!(
            out,
            " {} shards: each segment is {group} adjacent shards, coloured by the heaviest.",
            Num(shards.len() as u64)
        );
    }
    out.push_str("</p><div class=\"legend\">");
    for (i, (_, label)) in CLASSES.iter().enumerate() {
        let _ = write!(out, "<span><i class=\"c{i}\"></i>{label}</span>");
    }
    out.push_str("</div>");
    let total = |w: Weigh| shards.iter().map(w).sum::<u64>();
    let rows: [(&str, &str, Weigh); 2] = [
        ("band", "keyspread", |s| s.weight),
        ("md5-band", "MD5 of names", |s| s.md5_weight),
    ];
    for (id, label, weight) in rows {
        let mean = total(weight) as f64 / shards.len().max(1) as f64;
        let _ = write!(
            out,
            "<div class=\"bandrow\"><b>{label}</b><div class=\"band\" id=\"{id}\">"
        );
        // Few shards leave room to name them.
        let named = shards.len() <= NAMED_SEGMENTS;
        for part in shards.chunks(group) {
            segment(out, part, weight, mean, named);
        }
        out.push_str("</div></div>");
    }
    out.push_str(
        "<div class=\"axis\"><span>0</span><span>2<sup>126</sup></span><span>2<sup>127</sup></span>\
         <span>3·2<sup>126</sup></span><span>2<sup>128</sup> − 1</span></div></section>",
    );
}

/// One segment: a shard, or adjacent shards taken together.
fn segment(out: &mut String, part: &[ShardLoad], weight: Weigh, mean: f64, named: bool) {
    let (Some(first), Some(last)) = (part.first(), part.last()) else {
        return;
    };
    // Shares of the keyspace; f64 keeps 53 bits, plenty for a width.
    let width = (last.ending_hash_key.0 - first.starting_hash_key.0) as f64 / 2f64.powi(128);
    let heaviest = part.iter().map(weight).max().unwrap_or(0);
    let _ = write!(
        out,
        "<i class=\"{}\" style=\"flex-grow:{:.6}\" data-first=\"{}\" data-last=\"{}\" \
         data-max-weight=\"{heaviest}\" title=\"",
        class(heaviest as f64, mean),
        width,
        first.shard_index,
        last.shard_index,
    );
    if part.len() == 1 {
        let _ = write!(out, "shard {}", Esc(short_id(&first.shard_id)));
    } else {
        let _ = write!(
            out,
            "shards {}–{}: the heaviest",
            Esc(short_id(&first.shard_id)),
            Esc(short_id(&last.shard_id))
        );
    }
    let _ = write!(
        out,
        " weighs {} ({} the mean)\">{}</i>",
        Num(heaviest),
        Ratio(heaviest as f64, mean),
        Esc(if named { short_id(&first.shard_id) } else { "" })
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_fit_the_most_segments() {
        assert_eq!(group_size(0, 128), 1);
        assert_eq!(group_size(4, 128), 1);
        assert_eq!(group_size(128, 128), 1);
        assert_eq!(group_size(129, 128), 2);
        assert_eq!(group_size(1024, 128), 8);
        assert_eq!(group_size(10_000, 64), 157);
    }

    #[test]
    fn kinesis_shard_ids_read_as_their_number() {
        assert_eq!(short_id("shardId-000000000007"), "7");
        assert_eq!(short_id("shardId-000000000000"), "0");
        assert_eq!(short_id("shardId-000000001024"), "1024");
        assert_eq!(short_id("shard-a"), "shard-a");
        assert_eq!(short_id("shardId-x1"), "shardId-x1");
    }
}
