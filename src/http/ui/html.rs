//! Writing HTML by hand: escaping, numbers as people read them, and the page's shell.

use std::fmt::{self, Display, Write as _};

/// Text made safe for HTML content and double-quoted attribute values: everything a
/// client sent (account names, stream names) goes through it.
pub struct Esc<'a>(pub &'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// A query-string value, percent-encoded (then still to be escaped for an attribute).
pub fn query_value(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// A whole number with thousands separators: `1,000,000`.
pub struct Num(pub u64);

impl Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        for (i, digit) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                f.write_char(',')?;
            }
            f.write_char(digit)?;
        }
        Ok(())
    }
}

/// `part / whole` as a ratio such as `1.02×` (`–` when `whole` is 0).
pub struct Ratio(pub f64, pub f64);

impl Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1 > 0.0 {
            write!(f, "{:.2}×", self.0 / self.1)
        } else {
            f.write_str("–")
        }
    }
}

/// Seconds from now until an instant, as `in 23 h 59 min` (or `due` once passed).
pub struct Until(pub i64);

impl Display for Until {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0 / 1000;
        match s {
            ..=0 => f.write_str("due"),
            1..60 => write!(f, "in {s} s"),
            60..3600 => write!(f, "in {} min {} s", s / 60, s % 60),
            _ => write!(f, "in {} h {} min", s / 3600, s % 3600 / 60),
        }
    }
}

/// The document around a page's body: no script, no external resource, styles inline.
/// `refresh` asks the browser to load the page again every so many seconds.
pub fn document(
    out: &mut String,
    title: &str,
    refresh: Option<u32>,
    body: impl FnOnce(&mut String),
) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title>",
        Esc(title)
    );
    if let Some(seconds) = refresh {
        let _ = write!(out, "<meta http-equiv=\"refresh\" content=\"{seconds}\">");
    }
    out.push_str("<style>");
    out.push_str(super::style::CSS);
    out.push_str("</style></head><body>");
    body(out);
    out.push_str("</body></html>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_html_would_read_as_markup() {
        let hostile = r#"<script>alert("x")</script> & 'q'"#;
        assert_eq!(
            Esc(hostile).to_string(),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;q&#39;"
        );
        assert_eq!(Esc("plain-name_1.2").to_string(), "plain-name_1.2");
        assert_eq!(Esc("ünïcödé").to_string(), "ünïcödé");
    }

    #[test]
    fn numbers_read_with_separators() {
        let shown: Vec<String> = [0, 7, 999, 1000, 65_536, 1_000_000, u64::MAX]
            .map(|n| Num(n).to_string())
            .into();
        assert_eq!(
            shown,
            [
                "0",
                "7",
                "999",
                "1,000",
                "65,536",
                "1,000,000",
                "18,446,744,073,709,551,615"
            ]
        );
        assert_eq!(Ratio(3.0, 2.0).to_string(), "1.50×");
        assert_eq!(Ratio(3.0, 0.0).to_string(), "–");
        assert_eq!(Until(86_400_000).to_string(), "in 24 h 0 min");
        assert_eq!(Until(-5).to_string(), "due");
    }
}
