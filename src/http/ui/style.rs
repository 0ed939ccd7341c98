//! The page's style sheet, inline so the page makes no request of its own, and the load
//! classes its band and bars are coloured with.

/// Load classes: the upper bound of a shard's weight over the mean weight, and its legend.
pub const CLASSES: [(f64, &str); 6] = [
    (0.5, "under 0.5×"),
    (0.9, "0.5–0.9×"),
    (1.1, "0.9–1.1×"),
    (1.5, "1.1–1.5×"),
    (2.0, "1.5–2×"),
    (f64::INFINITY, "2× or more"),
];

/// The class (`c0` .. `c5`) of `weight` against `mean`; `ce` when there is no weight at all.
pub fn class(weight: f64, mean: f64) -> &'static str {
    if mean <= 0.0 {
        return "ce";
    }
    const NAMES: [&str; 6] = ["c0", "c1", "c2", "c3", "c4", "c5"];
    let ratio = weight / mean;
    let at = CLASSES
        .iter()
        .position(|(bound, _)| ratio < *bound)
        .unwrap_or(CLASSES.len() - 1);
    NAMES[at]
}

/// System fonts only: a web font would be a request.
pub const CSS: &str = "\
:root{--ink:#1d2733;--muted:#5b6776;--line:#d5dbe3;--panel:#f6f8fa;--ks:#2c6fbb;--md5:#9aa4b1}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,'Segoe UI','DejaVu Sans',sans-serif;color:var(--ink);background:#fff}
main{max-width:1240px;margin:0 auto;padding:18px 24px 40px}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:8px 24px;border-bottom:2px solid var(--ink);padding-bottom:10px}
h1{font-size:22px;margin:0}h1 small{font-weight:normal;color:var(--muted);font-size:15px}
h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid var(--line);padding-bottom:4px}
p.note{color:var(--muted);margin:4px 0 10px}
nav{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;font-size:13px}
nav a{color:var(--ks)}nav a.on{font-weight:bold;color:var(--ink);text-decoration:none}
form{display:inline-flex;gap:6px;align-items:center}input{width:5em;font:inherit;padding:1px 4px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(135px,1fr));gap:10px;margin-top:14px}
.card{background:var(--panel);border:1px solid var(--line);border-radius:6px;padding:8px 12px}
.card b{display:block;font-size:20px;white-space:nowrap}.card span{color:var(--muted);font-size:12px}
.card .label{display:block;text-transform:uppercase;letter-spacing:.04em;font-size:11px}
.card b small{font-size:11px;font-weight:normal;color:var(--muted)}.card b+b{font-size:16px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted);margin:6px 0}
.legend i{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle;border-radius:2px}
.band{display:flex;height:28px;border:1px solid var(--ink);border-radius:3px;overflow:hidden}
.band i{flex-basis:0;min-width:1px;border-right:1px solid rgba(255,255,255,.7);font:11px/26px sans-serif;font-style:normal;text-align:center;overflow:hidden}
.bandrow{display:grid;grid-template-columns:110px 1fr;gap:8px;align-items:center;margin:4px 0}
.axis{display:flex;justify-content:space-between;margin-left:118px;font-size:11px;color:var(--muted)}
.c0{background:#c6dbef}.c1{background:#8fbde0}.c2{background:#74c476}.c3{background:#fed976}
.c4{background:#fd8d3c}.c5{background:#d62728}.ce{background:#e4e7eb}
table{border-collapse:collapse;width:100%;font-size:13px}
th{text-align:left;font-weight:600;color:var(--muted);border-bottom:1px solid var(--line);padding:4px 8px}
td{border-bottom:1px solid #eef1f4;padding:3px 8px;vertical-align:middle}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.pair{display:grid;grid-template-columns:1fr 150px;gap:1px 8px;align-items:center;font-size:12px;font-variant-numeric:tabular-nums}
.bar{position:relative;height:9px;background:#eef1f4;border-radius:2px}
.bar i{position:absolute;left:0;top:0;bottom:0;border-radius:2px}
.bar .ks{background:var(--ks)}.bar .md5{background:var(--md5)}.bar .lo{opacity:1}.bar .hi{opacity:.45}
.bar .mean{position:absolute;top:-3px;bottom:-3px;width:2px;background:var(--ink)}
.key{display:inline-block;margin:1px 3px 1px 0;padding:0 5px;border-radius:3px;background:var(--panel);border:1px solid var(--line);font-size:12px;white-space:nowrap}
.key.next{border-style:dashed}
code{font-size:12px}.acct{font-weight:600;word-break:break-all}
.state{font-size:12px;color:var(--muted)}
footer{margin-top:30px;font-size:12px;color:var(--muted)}
";

#[cfg(test)]
mod tests {
    use super::class;

    #[test]
    fn classes_follow_the_weight_over_the_mean() {
        assert_eq!(class(0.0, 10.0), "c0");
        assert_eq!(class(7.0, 10.0), "c1");
        assert_eq!(class(10.0, 10.0), "c2");
        assert_eq!(class(12.0, 10.0), "c3");
        assert_eq!(class(19.9, 10.0), "c4");
        assert_eq!(class(20.0, 10.0), "c5");
        assert_eq!(class(5.0, 0.0), "ce");
    }
}
