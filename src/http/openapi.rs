//! The OpenAPI document: collected from the handlers, plus what no handler states.

use utoipa::Modify;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContactBuilder, OpenApi};

use crate::keyspace::HashKey;

/// Document-wide settings; `paths` come from the routers.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "keyspread",
        description = "The authoritative registry of account -> Kinesis ExplicitHashKey. \
                       Hash keys travel as decimal strings; errors are application/problem+json.",
    ),
    components(schemas(HashKey)),
    modifiers(&BearerAuth),
    tags(
        (name = "keys", description = "Assignments of accounts to hash keys"),
        (name = "shards", description = "Where keys land on a stream's shards"),
        (name = "rebalance", description = "Evening out accounts over shards"),
        (name = "health", description = "Liveness and readiness"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApi) {
        openapi.info.contact = Some(ContactBuilder::new().name(Some("keyspread")).build());
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}
