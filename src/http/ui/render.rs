//! The page itself: its header, summary and footer around the sections; and the page an
//! error gets.

use std::fmt::Write as _;

use super::html::{Esc, Num, document, query_value};
use super::{View, accounts, band, bars, cards, load, tables};
use crate::http::error::ApiError;
use crate::http::{timestamp, timestamp_ms};
use crate::registry::Stream;

/// The whole page.
pub(super) fn page(view: &View) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let title = match &view.stream {
        Some(stream) => format!("keyspread · {}", stream.name),
        None => format!("keyspread · {} uniform shards", view.map.len()),
    };
    document(&mut out, &title, view.refresh, |out| {
        out.push_str("<main>");
        header(out, view);
        cards::write(out, view);
        band::write(out, view);
        bars::write(out, view);
        accounts::write(out, view);
        load::hot_accounts(out, view);
        tables::moves(out, view);
        tables::workers(out, view);
        footer(out, view);
        out.push_str("</main>");
    });
    out
}

/// What the page shows, and how to show another map.
fn header(out: &mut String, view: &View) {
    let shards = view.map.len();
    let _ = write!(
        out,
        "<header><h1>keyspread <small>operator page</small></h1><nav>"
    );
    let (streams, more) = &view.streams;
    if !streams.is_empty() {
        out.push_str("<span>Streams:</span>");
    }
    for s in streams {
        let on = view
            .stream
            .as_ref()
            .is_some_and(|shown| shown.name == s.name);
        let _ = write!(
            out,
            "<a href=\"/ui?stream={}\"{}>{}{}</a>",
            Esc(&query_value(&s.name)),
            if on { " class=\"on\"" } else { "" },
            Esc(&s.name),
            if s.primary { " (primary)" } else { "" }
        );
    }
    if *more {
        out.push_str("<span>… (GET /streams lists them all)</span>");
    }
    let value = if view.stream.is_none() { shards } else { 8 };
    let _ = write!(
        out,
        "<form method=\"get\" action=\"/ui\"><label>Uniform map of \
         <input type=\"number\" name=\"shards\" min=\"1\" max=\"10000\" value=\"{value}\"> shards\
         </label><button type=\"submit\">Show</button></form>"
    );
    let here = match &view.stream {
        Some(s) => format!("stream={}", query_value(&s.name)),
        None => format!("shards={shards}"),
    };
    match view.refresh {
        Some(_) => {
            let _ = write!(out, "<a href=\"/ui?{}\">Stop refreshing</a>", Esc(&here));
        }
        None => {
            let _ = write!(
                out,
                "<a href=\"/ui?{}&amp;refresh=10\">Refresh every 10 s</a>",
                Esc(&here)
            );
        }
    }
    out.push_str("</nav></header>");
    let _ = match &view.stream {
        Some(s) => write!(
            out,
            "<h2 id=\"shown\" data-stream=\"{}\" data-shards=\"{shards}\">Stream {}{} · {} open shards \
             <small class=\"state\">({} map, version {})</small></h2>",
            Esc(&s.name),
            Esc(&s.name),
            if s.primary {
                " (primary: new keys balance on it)"
            } else {
                ""
            },
            Num(shards as u64),
            if s.uniform { "uniform" } else { "explicit" },
            s.version
        ),
        None => write!(
            out,
            "<h2 id=\"shown\" data-shards=\"{shards}\">Uniform map of {} shards \
             <small class=\"state\">(no stream chosen{})</small></h2>",
            Num(shards as u64),
            if streams.is_empty() {
                " and none registered"
            } else {
                ""
            }
        ),
    };
    if let Some(s) = &view.stream {
        sync_note(out, s);
    }
}

/// For a stream watched in Kinesis (or once watched): when it was last listed there, and
/// why the last listing failed, if it did.
fn sync_note(out: &mut String, s: &Stream) {
    if !s.watch && s.sync.synced_at.is_none() {
        return;
    }
    let listed = match s.sync.synced_at {
        Some(at) => format!("last listed from Kinesis at {}", timestamp(at)),
        None => "never listed from Kinesis yet".to_owned(),
    };
    let _ = write!(
        out,
        "<p id=\"sync\" class=\"note\">{}: {listed}",
        if s.watch {
            "Watched in Kinesis"
        } else {
            "No longer watched"
        }
    );
    if let Some(error) = &s.sync.sync_error {
        let _ = write!(
            out,
            "; the last listing failed ({}), the map is as last listed",
            Esc(error)
        );
    }
    out.push_str(".</p>");
}

/// When the page was made, and the JSON it was made from.
fn footer(out: &mut String, view: &View) {
    let map = match &view.stream {
        Some(s) => format!("stream={}", query_value(&s.name)),
        None => format!("shards={}", view.map.len()),
    };
    let _ = write!(
        out,
        "<footer id=\"made\" data-now=\"{0}\">Made at {0} by keyspread from the JSON routes: \
         <a href=\"/distribution?{1}\">/distribution?{1}</a>, <a href=\"/moves\">/moves</a>",
        timestamp_ms(view.now),
        Esc(&map)
    );
    if let Some(s) = &view.stream {
        let name = Esc(&query_value(&s.name)).to_string();
        let _ = write!(
            out,
            ", <a href=\"/streams/{name}/leases\">/streams/{name}/leases</a>"
        );
    }
    out.push_str(
        ", <a href=\"/keys\">/keys</a>; the whole API at <a href=\"/docs\">/docs</a>.</footer>",
    );
}

/// The page an error gets: its status, and what was wrong.
pub(super) fn error_page(err: &ApiError) -> String {
    let status = err.status();
    let title = format!(
        "{} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error")
    );
    let mut out = String::with_capacity(4096);
    document(&mut out, &format!("keyspread · {title}"), None, |out| {
        let _ = write!(
            out,
            "<main><header><h1>keyspread <small>operator page</small></h1></header>\
             <h2 id=\"error\" data-status=\"{}\">{}</h2><p id=\"detail\">{}</p>\
             <p><a href=\"/ui\">Back to the page</a> (the primary stream, or a uniform map)</p></main>",
            status.as_u16(),
            Esc(&title),
            Esc(err.detail())
        );
    });
    out
}
