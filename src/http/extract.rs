//! Extractors whose rejections the problem middleware turns into problem+json.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body that may be left out: an empty body (whatever its `Content-Type`, as some
/// generated clients always send one) or `null` means `None`.
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
        let Json(value) =
            Json::<Option<T>>::from_bytes(&bytes).map_err(IntoResponse::into_response)?;
        Ok(OptionalJson(value))
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
    fn json_media_types() {
        assert!(is_json_media_type("application/json"));
        assert!(is_json_media_type("Application/JSON; charset=utf-8"));
        assert!(is_json_media_type("application/merge-patch+json"));
        assert!(!is_json_media_type("text/plain"));
        assert!(!is_json_media_type("application/jsonx"));
    }
}
