//! What each operation needs: one table, read by the authorization middleware and written
//! into both OpenAPI documents, so the two cannot disagree.

use axum::http::Method;

use crate::config::Role;

/// What a request needs before it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: liveness and readiness, for probes.
    Nothing,
    /// `--metrics-token`, if one is set (checked by the handler).
    MetricsToken,
    /// A token of this role (or admin); reads need one only with `--read-access token`.
    Role(Role),
}

use Need::{MetricsToken, Nothing, Role as R};
use Role::{Admin, Consume, Produce, Read};

/// Every operation of the API, by method and route template.
pub const OPERATIONS: &[(&str, &str, Need)] = &[
    ("GET", "/", R(Read)),
    ("GET", "/ui", R(Read)),
    ("GET", "/healthz", Nothing),
    ("GET", "/readyz", Nothing),
    ("GET", "/readyz/writes", Nothing),
    ("GET", "/metrics", MetricsToken),
    ("GET", "/events", R(Read)),
    ("GET", "/snapshot", R(Read)),
    ("GET", "/keys", R(Read)),
    ("GET", "/keys/{account}", R(Read)),
    ("POST", "/keys/{account}", R(Produce)),
    ("POST", "/keys/batch", R(Produce)),
    ("DELETE", "/keys/{account}", R(Admin)),
    ("PATCH", "/keys/{account}", R(Admin)),
    ("GET", "/shard-of", R(Read)),
    ("GET", "/distribution", R(Read)),
    ("GET", "/moves", R(Read)),
    ("GET", "/load", R(Read)),
    ("POST", "/load/producers", R(Produce)),
    ("GET", "/rebalance/preview", R(Read)),
    ("POST", "/rebalance", R(Admin)),
    ("GET", "/streams", R(Read)),
    ("GET", "/streams/{name}", R(Read)),
    ("PUT", "/streams/{name}", R(Admin)),
    ("DELETE", "/streams/{name}", R(Admin)),
    ("GET", "/streams/{name}/split-plan", R(Read)),
    ("GET", "/streams/{name}/reshard", R(Read)),
    ("POST", "/streams/{name}/reshard", R(Admin)),
    ("GET", "/streams/{name}/leases", R(Read)),
    ("PUT", "/streams/{name}/workers/{worker}", R(Consume)),
    ("DELETE", "/streams/{name}/workers/{worker}", R(Consume)),
    (
        "PUT",
        "/streams/{name}/leases/{shard_id}/checkpoint",
        R(Consume),
    ),
];

/// What `method` on the route `template` needs. Routes outside the API (the documents,
/// Swagger UI) are reads; a method not in the table needs admin, so that nothing new is
/// open by omission.
pub fn need(method: &Method, template: &str) -> Need {
    let method = if *method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    OPERATIONS
        .iter()
        .find(|(m, t, _)| *m == method && *t == template)
        .map(|(_, _, need)| *need)
        .unwrap_or(match method {
            "GET" | "OPTIONS" => R(Read),
            _ => R(Admin),
        })
}

/// What an operation of the document needs: `None` if the table lacks it.
pub fn documented(method: &str, template: &str) -> Option<Need> {
    let method = method.to_ascii_uppercase();
    OPERATIONS
        .iter()
        .find(|(m, t, _)| *m == method && *t == template)
        .map(|(_, _, need)| *need)
}
