//! Extractors whose rejections the problem middleware turns into problem+json.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body that may be left out: an empty body (whatever its `Content-Type`, as some
/// generated clients always send one) means `None`. A body that is sent must be a `T`;
/// `null` is not one, as the document says (it cannot offer `null` without generated
/// clients making the body required).
pub struct OptionalJson<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJson<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let is_json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_json_media_type);
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "a request body must be JSON: send Content-Type: application/json",
            )
            .into_response());
        }
        let Json(value) = Json::<T>::from_bytes(&bytes).map_err(IntoResponse::into_response)?;
        Ok(OptionalJson(Some(value)))
    }
}

/// A query string whose names and values must be UTF-8 once percent-decoded: axum's
/// `Query` would put U+FFFD in place of the rest, and a key would be hashed from that.
pub struct Utf8Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Utf8Query<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        for pair in parts.uri.query().unwrap_or_default().split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if std::str::from_utf8(&form_decode(value)).is_err() {
                let name = String::from_utf8_lossy(&form_decode(name)).into_owned();
                let detail = format!("query parameter `{}` is not UTF-8", super::clip(&name));
                return Err(ApiError::bad_request(detail).into_response());
            }
        }
        let Query(value) = Query::<T>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Utf8Query(value))
    }
}

/// `application/x-www-form-urlencoded` decoding of one name or value, to bytes: `+` is a
/// space, `%XX` a byte; a `%` without two hex digits stays as it is.
fn form_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b'+', ..) => {
                out.push(b' ');
                i += 1;
            }
            (byte, ..) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// A deserializer that takes structs from JSON objects only: serde's derive also takes one
/// from an array of its fields (`[5]` for `{"weight": 5}`), which the document does not offer.
pub struct MapOnly<D>(pub D);

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for MapOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// Gives each request body type, derived with `#[serde(remote = "Self")]`, a `Deserialize`
/// that reads it from a JSON object only (see [`MapOnly`]).
macro_rules! objects_only {
    ($($body:ty),+ $(,)?) => {$(
        impl<'de> serde::Deserialize<'de> for $body {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <$body>::deserialize($crate::http::extract::MapOnly(d))
            }
        }
    )+};
}
pub(crate) use objects_only;

/// Counts and weights in JSON bodies. The document calls them `integer`, which in JSON
/// Schema includes numbers written with a zero fraction (`3.0`), so those are taken too.
pub mod whole_number {
    use std::fmt;

    use serde::Deserializer;
    use serde::de::{self, Deserialize, Unexpected, Visitor};

    struct Whole(u64);

    impl<'de> Deserialize<'de> for Whole {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(WholeVisitor).map(Whole)
        }
    }

    struct WholeVisitor;

    impl Visitor<'_> for WholeVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a whole number")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            // 2^64 as f64 is exact; below it every whole f64 converts exactly.
            if v.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&v) {
                Ok(v as u64)
            } else {
                Err(E::invalid_value(Unexpected::Float(v), &self))
            }
        }
    }

    pub fn required<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        Whole::deserialize(d).map(|w| w.0)
    }

    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<Whole>::deserialize(d).map(|w| w.map(|w| w.0))
    }
}

/// `application/json`, or any `application/*+json`, with or without parameters.
fn is_json_media_type(value: &str) -> bool {
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The request's `If-None-Match` values, and nothing else: cloning every header, as a
/// `HeaderMap` extractor does, would cost the lookup route more than its own work.
pub struct IfNoneMatch(Vec<HeaderValue>);

impl<S: Send + Sync> FromRequestParts<S> for IfNoneMatch {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(IfNoneMatch(
            parts
                .headers
                .get_all(header::IF_NONE_MATCH)
                .iter()
                .cloned()
                .collect(),
        ))
    }
}

impl IfNoneMatch {
    /// Whether the client's cached copy with one of these tags is still `current`
    /// (`*` matches anything; weak tags compare by their opaque part).
    pub fn matches(&self, current: &str) -> bool {
        self.0
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().trim_start_matches("W/"))
            .any(|t| t == "*" || t == current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_decoding_reads_escapes_and_plus() {
        assert_eq!(form_decode("caf%C3%A9+1"), "caf\u{e9} 1".as_bytes());
        assert_eq!(form_decode("%ff%FE"), [0xFF, 0xFE]);
        assert_eq!(form_decode("100%"), b"100%");
        assert_eq!(form_decode("%zz%4"), b"%zz%4");
    }

    #[derive(Debug, serde::Deserialize)]
    struct Counts {
        #[serde(deserialize_with = "whole_number::required")]
        n: u64,
        #[serde(default, deserialize_with = "whole_number::optional")]
        m: Option<u64>,
    }

    #[test]
    fn whole_numbers_with_or_without_a_fraction() {
        let parse = |json: &str| serde_json::from_str::<Counts>(json).map(|c| (c.n, c.m));
        assert_eq!(parse(r#"{"n": 3}"#).unwrap(), (3, None));
        assert_eq!(
            parse(r#"{"n": 3.0, "m": 70991.0}"#).unwrap(),
            (3, Some(70991))
        );
        assert_eq!(parse(r#"{"n": 1e3, "m": null}"#).unwrap(), (1000, None));
        for bad in [
            r#"{"n": 2.5}"#,
            r#"{"n": -1}"#,
            r#"{"n": -1.0}"#,
            r#"{"n": 1e30}"#,
            r#"{"n": "3"}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_media_types() {
        assert!(is_json_media_type("application/json"));
        assert!(is_json_media_type("Application/JSON; charset=utf-8"));
        assert!(is_json_media_type("application/merge-patch+json"));
        assert!(!is_json_media_type("text/plain"));
        assert!(!is_json_media_type("application/jsonx"));
    }
}
