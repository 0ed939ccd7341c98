//! The OpenAPI document: collected from the handlers, plus what no handler states.

use utoipa::Modify;
use utoipa::openapi::schema::{Schema, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContactBuilder, OpenApi, RefOr};

use super::PROBLEM_JSON;
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
        (name = "streams", description = "Real shard maps of Kinesis streams, and split plans"),
        (name = "health", description = "Liveness and readiness"),
        (name = "observability", description = "Metrics and the event log"),
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

/// utoipa writes an `Option<T>` request body as `oneOf: [null, T]`, not required. What such a
/// body means here is "may be left out": keep it not required and describe it as plain `T`,
/// which generated clients turn into an optional argument.
pub fn optional_bodies(doc: &mut OpenApi) {
    for operation in mutations(doc) {
        let Some(body) = operation.request_body.as_mut() else {
            continue;
        };
        for content in body.content.values_mut() {
            if let Some(RefOr::T(Schema::OneOf(one))) = &content.schema {
                let mut others = one.items.iter().filter(|s| !is_null(s));
                if let (Some(only), None) = (others.next(), others.next()) {
                    content.schema = Some(only.clone());
                }
            }
        }
    }
}

/// Every operation that may change something: POST, PUT, PATCH and DELETE.
fn mutations(doc: &mut OpenApi) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    doc.paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
    })
}

fn is_null(schema: &RefOr<Schema>) -> bool {
    matches!(schema, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null))
}

/// What every mutation may answer besides its own responses, said once, here, for all:
/// 401 and 403 from the token check (`middleware::guard_mutations`), 429 from the
/// per-client rate limit, 503 when the database cannot take the change.
pub fn guarded_mutations(doc: &mut OpenApi) {
    use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, ResponseBuilder};
    let problem = || {
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
            .build()
    };
    let refused = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(PROBLEM_JSON, problem())
            .build()
    };
    let retry_after = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(utoipa::openapi::ObjectBuilder::new().schema_type(Type::Integer))
                    .description(Some("Seconds to wait before trying again"))
                    .build(),
            )
            .content(PROBLEM_JSON, problem())
            .build()
    };
    let guards = [
        ("401", refused("Token missing or wrong")),
        (
            "403",
            refused("No token configured and the client is not local"),
        ),
        (
            "429",
            retry_after("Too many mutations from this client; retry after the given seconds"),
        ),
        (
            "503",
            retry_after(
                "The database cannot take the change now (unreachable, or held up by another \
                 writer); the change may or may not have been made: send it again after the \
                 given seconds",
            ),
        ),
    ];
    for operation in mutations(doc) {
        for (status, response) in &guards {
            operation
                .responses
                .responses
                .insert((*status).to_owned(), RefOr::T(response.clone()));
        }
    }
}
