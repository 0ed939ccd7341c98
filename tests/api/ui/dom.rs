//! Reading a serialized DOM: its start tags with their attributes, in document order, and
//! the text of an element. Enough for the page's own markup, with quoted attributes.

use std::collections::HashMap;

/// A start tag: its name, attributes (unescaped) and where it ends in the document.
#[derive(Debug, Clone)]
pub struct Tag {
    pub name: String,
    pub attrs: HashMap<String, String>,
    /// Byte offset just past its `>`.
    pub end: usize,
}

impl Tag {
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.get(name).map(String::as_str)
    }

    /// The attribute `name`, which must be there.
    pub fn get(&self, name: &str) -> &str {
        self.attr(name)
            .unwrap_or_else(|| panic!("<{}> lacks {name}: {:?}", self.name, self.attrs))
    }

    /// The attribute `name` as a number.
    pub fn num(&self, name: &str) -> u64 {
        self.get(name).parse().expect("a whole number")
    }

    pub fn has(&self, name: &str) -> bool {
        self.attrs.contains_key(name)
    }
}

/// Every start tag of `html`, in order.
pub fn tags(html: &str) -> Vec<Tag> {
    let bytes = html.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(open) = html[at..].find('<').map(|o| at + o) {
        at = open + 1;
        if !bytes.get(at).is_some_and(u8::is_ascii_alphabetic) {
            continue;
        }
        let name_end = html[at..]
            .find(|c: char| c.is_ascii_whitespace() || c == '>' || c == '/')
            .map_or(html.len(), |e| at + e);
        let name = html[at..name_end].to_ascii_lowercase();
        let mut attrs = HashMap::new();
        at = name_end;
        loop {
            while bytes
                .get(at)
                .is_some_and(|b| b.is_ascii_whitespace() || *b == b'/')
            {
                at += 1;
            }
            match bytes.get(at) {
                None => break,
                Some(b'>') => {
                    at += 1;
                    break;
                }
                Some(_) => {}
            }
            let key_end = html[at..]
                .find(|c: char| c.is_ascii_whitespace() || c == '=' || c == '>')
                .map_or(html.len(), |e| at + e);
            let key = html[at..key_end].to_ascii_lowercase();
            at = key_end;
            let mut value = String::new();
            if bytes.get(at) == Some(&b'=') {
                let quote = bytes[at + 1];
                assert!(quote == b'"' || quote == b'\'', "unquoted attribute {key}");
                let close = html[at + 2..].find(quote as char).expect("closed quote") + at + 2;
                value = unescape(&html[at + 2..close]);
                at = close + 1;
            }
            attrs.insert(key, value);
        }
        found.push(Tag {
            name,
            attrs,
            end: at,
        });
    }
    found
}

/// The text from the end of `tag` to the next `<`, unescaped.
pub fn text_after(html: &str, tag: &Tag) -> String {
    let rest = &html[tag.end..];
    unescape(&rest[..rest.find('<').unwrap_or(rest.len())])
}

/// Character references as the page and Chromium's serializer write them.
pub fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// The only tag whose `attr` is `value`.
pub fn one<'a>(tags: &'a [Tag], attr: &str, value: &str) -> &'a Tag {
    let mut matching = tags.iter().filter(|t| t.attr(attr) == Some(value));
    let found = matching
        .next()
        .unwrap_or_else(|| panic!("no tag with {attr}={value:?}"));
    assert!(
        matching.next().is_none(),
        "several tags with {attr}={value:?}"
    );
    found
}

#[test]
fn reads_tags_attributes_and_text() {
    let html = r#"<!DOCTYPE html><p id="a" data-x="1 &amp; &quot;2&quot;">t &lt;b&gt;</p><br/><i class='c' hidden>"#;
    let found = tags(html);
    let names: Vec<&str> = found.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["p", "br", "i"]);
    assert_eq!(found[0].get("data-x"), "1 & \"2\"");
    assert_eq!(text_after(html, &found[0]), "t <b>");
    assert!(found[2].has("hidden"));
    assert_eq!(found[2].get("class"), "c");
}
