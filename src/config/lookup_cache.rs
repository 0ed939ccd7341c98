//! How long lookup answers may be cached, and how that is cut short before a switch.
//!
//! A staged move must outlive every cached answer that names the old key, so the default
//! wait before a switch is the longest a cache may serve an answer ([`LookupCache::lifetime`]),
//! and an answer given while a switch is pending may be cached only until the switch.

use axum::http::HeaderValue;

/// Longest a lookup answer may be cached, in seconds, and so the longest a staged switch
/// waits (a day).
pub const MAX_LIFETIME_S: u64 = 86_400;

/// The configured `Cache-Control` of lookup answers, read once.
#[derive(Debug, Clone)]
pub struct LookupCache {
    header: HeaderValue,
    /// The directives other than those bounding an answer's life, as configured.
    others: Vec<String>,
    /// `max-age`, `s-maxage` and `stale-while-revalidate`, in seconds, where configured.
    max_age: Option<u64>,
    s_maxage: Option<u64>,
    stale_while_revalidate: Option<u64>,
    /// Whether `stale-if-error` is configured: it could serve an answer past any switch.
    stale_if_error: bool,
}

impl LookupCache {
    /// Reads the configured header. Refuses a directive bounding an answer's life that is
    /// given twice (caches differ on which one counts) or is not whole seconds, and a
    /// lifetime past [`MAX_LIFETIME_S`], the longest a staged switch waits: a cached answer
    /// would outlive the old key. Refuses a lifetime of 0 too: no operator needs it (a
    /// max-age beside `no-cache` revalidates every lookup) and it breaks mirrors and moves.
    pub fn parse(header: HeaderValue) -> Result<Self, String> {
        let text = header
            .to_str()
            .map_err(|_| "not visible ASCII".to_owned())?
            .to_owned();
        let mut cache = LookupCache {
            header,
            others: Vec::new(),
            max_age: None,
            s_maxage: None,
            stale_while_revalidate: None,
            stale_if_error: false,
        };
        for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let (name, value) = match directive.split_once('=') {
                Some((name, value)) => (name.trim(), Some(value.trim().trim_matches('"'))),
                None => (directive, None),
            };
            let name = name.to_ascii_lowercase();
            let slot = match name.as_str() {
                "max-age" => &mut cache.max_age,
                "s-maxage" => &mut cache.s_maxage,
                "stale-while-revalidate" => &mut cache.stale_while_revalidate,
                // Serving stale after an error could outlive any switch: never before one.
                "stale-if-error" => {
                    cache.stale_if_error = true;
                    continue;
                }
                _ => {
                    cache.others.push(directive.to_owned());
                    continue;
                }
            };
            if slot.is_some() {
                return Err(format!("{name} is given twice"));
            }
            let seconds = value.and_then(|v| v.parse::<u64>().ok());
            *slot = Some(seconds.ok_or_else(|| format!("{name} must be whole seconds"))?);
        }
        if cache.lifetime() > MAX_LIFETIME_S {
            return Err(format!(
                "answers could be cached {} s, longer than the longest switch ({MAX_LIFETIME_S} s): \
                 max-age (or s-maxage) plus stale-while-revalidate must be at most {MAX_LIFETIME_S}",
                cache.lifetime()
            ));
        }
        if cache.lifetime() == 0 {
            return Err(
                "answers could be cached 0 s (max-age=0, or no max-age as with no-cache or \
                 no-store alone): every mirror would be Stale at once and stay so (a mirror \
                 answers only within the snapshot's max_age_s, this lifetime, of its last sync), \
                 and staged moves would switch the moment they are applied, unannounced (their \
                 wait defaults to this lifetime). Set max-age to at least 1 (the default is \
                 max-age=60); to have caches revalidate every lookup, keep a max-age beside \
                 no-cache: max-age=60, no-cache; a rebalance that must switch at once can say \
                 switch_after_s: 0"
                    .to_owned(),
            );
        }
        Ok(cache)
    }

    /// The header as configured.
    pub fn header(&self) -> &HeaderValue {
        &self.header
    }

    /// Longest any cache may serve an answer, in seconds: the larger of `max-age` and
    /// `s-maxage`, plus `stale-while-revalidate`; at least 1 once parsed.
    pub fn lifetime(&self) -> u64 {
        let fresh = self.max_age.max(self.s_maxage).unwrap_or(0);
        fresh.saturating_add(self.stale_while_revalidate.unwrap_or(0))
    }

    /// The header for an answer that stops being true in `seconds_left` seconds: every
    /// lifetime cut to it, no serving stale. The configured header when it allows no
    /// longer than that already.
    pub fn until(&self, seconds_left: u64) -> HeaderValue {
        if self.lifetime() <= seconds_left && !self.stale_if_error {
            return self.header.clone();
        }
        let cut = |configured: Option<u64>| configured.map(|s| s.min(seconds_left));
        let mut directives = self.others.clone();
        directives.push(format!(
            "max-age={}",
            cut(self.max_age).unwrap_or(seconds_left)
        ));
        if let Some(s) = cut(self.s_maxage) {
            directives.push(format!("s-maxage={s}"));
        }
        HeaderValue::from_str(&directives.join(", ")).expect("configured directives and digits")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(text: &str) -> LookupCache {
        LookupCache::parse(HeaderValue::from_str(text).unwrap()).unwrap()
    }

    fn refused(text: &str) -> String {
        LookupCache::parse(HeaderValue::from_str(text).unwrap()).unwrap_err()
    }

    #[test]
    fn lifetimes_past_the_longest_switch_and_repeated_bounds_are_refused() {
        assert_eq!(cache("max-age=86400").lifetime(), 86_400);
        assert!(refused("max-age=86401").contains("86401 s"));
        assert!(refused("s-maxage=90000, max-age=1").contains("at most 86400"));
        assert!(refused("max-age=86000, stale-while-revalidate=401").contains("86401"));
        assert_eq!(refused("max-age=1, Max-Age=2"), "max-age is given twice");
        assert_eq!(refused("s-maxage=1, s-maxage=1"), "s-maxage is given twice");
        assert_eq!(refused("max-age=-1"), "max-age must be whole seconds");
        assert_eq!(refused("max-age"), "max-age must be whole seconds");
    }

    /// A lifetime of 0 leaves every mirror Stale and switches staged moves unannounced.
    #[test]
    fn a_lifetime_of_0_is_refused_saying_what_to_set() {
        for text in [
            "max-age=0",
            "no-cache",
            "no-store",
            "private",
            "max-age=0, s-maxage=0, stale-while-revalidate=0",
        ] {
            let why = refused(text);
            assert!(why.contains("0 s"), "{text}: {why}");
            assert!(
                why.contains("Stale") && why.contains("switch"),
                "{text}: {why}"
            );
            assert!(why.contains("max-age=60, no-cache"), "{text}: {why}");
        }
        assert_eq!(cache("no-cache, max-age=60").lifetime(), 60);
        assert_eq!(cache("max-age=0, stale-while-revalidate=5").lifetime(), 5);
        assert_eq!(cache("no-store, s-maxage=1").lifetime(), 1);
    }

    #[test]
    fn the_lifetime_is_the_longest_a_cache_may_serve() {
        assert_eq!(cache("max-age=60").lifetime(), 60);
        assert_eq!(cache("public, max-age=10, s-maxage=30").lifetime(), 30);
        assert_eq!(cache("max-age=10, stale-while-revalidate=5").lifetime(), 15);
        assert_eq!(cache("no-cache, max-age=20").lifetime(), 20);
        assert_eq!(cache("MAX-AGE=\"7\"").lifetime(), 7);
    }

    #[test]
    fn answers_before_a_switch_are_cached_no_longer_than_it() {
        assert_eq!(cache("max-age=60").until(12), "max-age=12");
        assert_eq!(cache("max-age=60").until(0), "max-age=0");
        assert_eq!(cache("max-age=60").until(60), "max-age=60");
        assert_eq!(cache("max-age=60").until(600), "max-age=60");
        assert_eq!(
            cache("private, max-age=60, stale-while-revalidate=30").until(40),
            "private, max-age=40"
        );
        assert_eq!(
            cache("public, max-age=5, s-maxage=60").until(20),
            "public, max-age=5, s-maxage=20"
        );
        assert_eq!(
            cache("max-age=5, stale-if-error=600").until(20),
            "max-age=5"
        );
        assert_eq!(
            cache("no-cache, max-age=60").until(3),
            "no-cache, max-age=3"
        );
    }
}
