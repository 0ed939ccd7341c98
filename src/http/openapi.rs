//! The OpenAPI document: collected from the handlers, plus what no handler states.

use utoipa::Modify;
use utoipa::openapi::schema::{Schema, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContactBuilder, OpenApi, RefOr};

use super::PROBLEM_JSON;
use super::roles::{self, Need};
use crate::config::Role;
use crate::keyspace::HashKey;

/// Document-wide settings; `paths` come from the routers.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "keyspread",
        description = "The authoritative registry of account -> Kinesis ExplicitHashKey. \
                       Hash keys travel as decimal strings; errors are application/problem+json. \
                       Each operation names the role it needs (x-keyspread-role): read, \
                       produce (allocate), consume (a consumer worker's calls) or admin \
                       (everything). A server with tokens (--token, --tokens-file) takes a \
                       change only with a bearer token of that role, and reads too with \
                       --read-access token. Without tokens, only clients on the server's host \
                       may change anything, not from pages of other sites (Origin), and only \
                       requests naming a loopback host or one of --allowed-hosts are answered \
                       (Host), reads included.",
    ),
    components(schemas(HashKey)),
    modifiers(&BearerAuth),
    tags(
        (name = "keys", description = "Assignments of accounts to hash keys"),
        (name = "shards", description = "Where keys land on a stream's shards"),
        (name = "rebalance", description = "Evening out accounts over shards"),
        (name = "streams", description = "Real shard maps of Kinesis streams, and split plans"),
        (name = "leases", description = "Consumer leases: which worker reads which shard, balanced by weight"),
        (name = "load", description = "Observed load: what consumer workers report reading, smoothed per shard and per account"),
        (name = "health", description = "Liveness and readiness"),
        (name = "observability", description = "Metrics and the event log"),
        (name = "page", description = "The operator page: HTML for people, made from the same calls as the JSON"),
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
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from --token (role admin) or --tokens-file; each operation's \
                         requirement names the role it needs (x-keyspread-role): read, \
                         produce, consume or admin, and admin may do everything",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "metricsToken",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("--metrics-token, which only GET /metrics takes"))
                    .build(),
            ),
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
/// 429 from the per-client rate limit, 503 when the change was not made (the database
/// cannot take it now), 504 when its commit was sent and its answer lost (401 and 403 come
/// from [`role_security`]).
pub fn guarded_mutations(doc: &mut OpenApi) {
    use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, ResponseBuilder};
    let problem = || {
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
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
        (
            "429",
            retry_after("Too many mutations from this client; retry after the given seconds"),
        ),
        (
            "503",
            retry_after(
                "The change was not made, and will not be: the database cannot take it now \
                 (unreachable, or held up by another writer), or it could not commit before \
                 its deadline. Send it again after the given seconds",
            ),
        ),
        (
            "504",
            ResponseBuilder::new()
                .description(
                    "problem `outcome-unknown`: the change's commit was sent to the database and \
                     the connection was lost before its answer came, so it may or may not have \
                     been made. Send it again with the same Idempotency-Key: its first outcome \
                     is replayed if it was made, and it is made now if it was not",
                )
                .content(PROBLEM_JSON, problem())
                .build(),
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

/// Every change takes an optional `Idempotency-Key` header, and may answer 409 while the
/// first request with its key is being made and 422 when the key named another request;
/// said once, here, for all.
pub fn idempotent_mutations(doc: &mut OpenApi) {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::{ContentBuilder, ObjectBuilder, Ref, Required, ResponseBuilder};
    let key = ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "Names this request (a UUID, say; 1 to 255 visible ASCII characters), per token:              its first committed answer is kept 24 h, and a repeat with the same key, method,              path and body is answered that again (with `Idempotent-Replayed: true`) without              being applied again. Refusals for the moment (408, 429, 503, 504) are not kept: a              retry after one is applied as new",
        ))
        .schema(Some(Ref::from_schema_name("IdempotencyKey")))
        .build();
    let components = doc.components.get_or_insert_with(Default::default);
    components.schemas.insert(
        "IdempotencyKey".to_owned(),
        RefOr::T(Schema::Object(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(super::idempotency::MAX_KEY_LEN))
                .pattern(Some(super::idempotency::KEY_PATTERN))
                .description(Some(
                    "Names one request, per token: 1 to 255 printable ASCII characters, \
                     not starting or ending with a space (a UUID, say); the draft's quoted \
                     form `\"...\"` names the key inside the quotes",
                ))
                .build(),
        )),
    );
    let cases = [
        (
            "400",
            "An Idempotency-Key that is not 1 to 255 printable ASCII characters (problem \
             `bad-request`)",
        ),
        (
            "409",
            "A request with the same Idempotency-Key is being made now (problem \
             `idempotency-key-in-use`): send it again to be told its answer",
        ),
        (
            "422",
            "The Idempotency-Key was sent before with another request (problem \
             `idempotency-key-reused`)",
        ),
    ];
    for operation in mutations(doc) {
        operation
            .parameters
            .get_or_insert_with(Vec::new)
            .push(key.clone());
        for (status, case) in cases {
            let responses = &mut operation.responses.responses;
            match responses.get_mut(status) {
                Some(RefOr::T(response)) => {
                    response.description = format!("{} Or: {case}", response.description);
                }
                _ => {
                    let problem = ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build();
                    let response = ResponseBuilder::new()
                        .description(case)
                        .content(PROBLEM_JSON, problem)
                        .build();
                    responses.insert(status.to_owned(), RefOr::T(response));
                }
            }
        }
    }
}

/// Every operation states what it needs, from [`roles::OPERATIONS`]: `x-keyspread-role`,
/// its security requirements (`{}` first where it may go without a token: reads while they
/// are open, and every change on a server without tokens, from its own host), and the 401
/// and 403 it may answer. An operation the table lacks stops the document being built.
pub fn role_security(doc: &mut OpenApi) {
    use utoipa::openapi::extensions::ExtensionsBuilder;
    use utoipa::openapi::security::SecurityRequirement;
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let refused = |description: String| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    PROBLEM_JSON,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build(),
        )
    };
    let foreign_host = "Without tokens, the request names a host that is neither loopback nor \
                        in --allowed-hosts";
    for (path, item) in doc.paths.paths.iter_mut() {
        let operations = [
            ("get", &mut item.get),
            ("post", &mut item.post),
            ("put", &mut item.put),
            ("patch", &mut item.patch),
            ("delete", &mut item.delete),
        ];
        for (method, operation) in operations {
            let Some(operation) = operation.as_mut() else {
                continue;
            };
            let need = roles::documented(method, path).unwrap_or_else(|| {
                panic!(
                    "{} {path} has no role in http::roles::OPERATIONS",
                    method.to_uppercase()
                )
            });
            let (label, security, unauthorized, forbidden) = match need {
                Need::Nothing => ("none", vec![SecurityRequirement::default()], None, None),
                Need::MetricsToken => (
                    "metrics",
                    vec![
                        SecurityRequirement::default(),
                        SecurityRequirement::new("metricsToken", Vec::<String>::new()),
                    ],
                    None,
                    None,
                ),
                Need::Role(role) => (
                    role.as_str(),
                    vec![
                        SecurityRequirement::default(),
                        SecurityRequirement::new("bearer", [role.as_str()]),
                    ],
                    Some(match role {
                        Role::Read => "With --read-access token: no token, or one this server \
                                       does not take"
                            .to_owned(),
                        _ => "No token, or one this server does not take".to_owned(),
                    }),
                    Some(match role {
                        Role::Read => foreign_host.to_owned(),
                        _ => format!(
                            "The token lacks the {role} role (the problem names the role \
                             needed); or, without tokens, the client is not on the server's \
                             host, or the request came from a page of another site (Origin) or \
                             names a host that is neither loopback nor in --allowed-hosts"
                        ),
                    }),
                ),
            };
            operation.security = Some(security);
            operation.extensions =
                Some(ExtensionsBuilder::new().add(ROLE_EXTENSION, label).build());
            let responses = &mut operation.responses.responses;
            if let Some(description) = unauthorized {
                responses.insert("401".to_owned(), refused(description));
            }
            let forbidden =
                forbidden.or_else(|| (method == "get").then(|| foreign_host.to_owned()));
            if let Some(description) = forbidden {
                responses.insert("403".to_owned(), refused(description));
            }
        }
    }
}

/// The extension naming each operation's role: `read`, `produce`, `consume`, `admin`,
/// `metrics` (the metrics token) or `none`.
pub const ROLE_EXTENSION: &str = "x-keyspread-role";

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// The schema at `pointer` in the document, following a `$ref` at its end.
    fn schema(doc: &Value, pointer: &str) -> Value {
        let found = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("no {pointer}"));
        match found["$ref"].as_str() {
            Some(target) => schema(doc, target.trim_start_matches('#')),
            None => found.clone(),
        }
    }

    /// `found` itself, or the schema its `$ref` names.
    fn resolved(doc: &Value, found: &Value) -> Value {
        match found["$ref"].as_str() {
            Some(target) => schema(doc, target.trim_start_matches('#')),
            None => found.clone(),
        }
    }

    /// The schema of query or path parameter `name` of `method path`.
    fn param(doc: &Value, method: &str, path: &str, name: &str) -> Value {
        let params = doc["paths"][path][method]["parameters"].as_array().unwrap();
        let found = params.iter().position(|p| p["name"] == name).unwrap();
        schema(
            doc,
            &format!(
                "/paths/{}/{method}/parameters/{found}/schema",
                path.replace('/', "~1")
            ),
        )
    }

    /// Whether `schema` lets `null` through: a 3.1 type list with "null", a 3.0
    /// `nullable`, null in an `enum`, or such a `oneOf`/`anyOf` branch.
    fn admits_null(schema: &Value) -> bool {
        let has_null = |v: &Value| v.as_array().is_some_and(|all| all.contains(&"null".into()));
        let null = |s: &Value| {
            s["type"] == "null"
                || has_null(&s["type"])
                || s["nullable"] == true
                || s["enum"]
                    .as_array()
                    .is_some_and(|all| all.contains(&Value::Null))
        };
        null(schema)
            || ["oneOf", "anyOf"].iter().any(|k| {
                schema[k]
                    .as_array()
                    .is_some_and(|branches| branches.iter().any(null))
            })
    }

    /// Every header a request or an answer may carry, as (where, schema).
    fn headers(doc: &Value) -> Vec<(String, Value)> {
        let mut found = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let params = operation["parameters"].as_array().into_iter().flatten();
                for p in params.filter(|p| p["in"] == "header") {
                    let at = format!("{method} {path} {}", p["name"]);
                    found.push((at, resolved(doc, &p["schema"])));
                }
                let responses = operation["responses"].as_object().into_iter().flatten();
                for (status, response) in responses {
                    for (name, header) in response["headers"].as_object().into_iter().flatten() {
                        let at = format!("{method} {path} {status} {name}");
                        found.push((at, resolved(doc, &header["schema"])));
                    }
                }
            }
        }
        found
    }

    /// A header is text or absent, never null: generated clients type a nullable header
    /// as an optional null and some fail to compile on it.
    #[test]
    fn no_header_is_nullable() {
        use super::super::{openapi_30_json, openapi_json};
        for text in [openapi_json(), openapi_30_json()] {
            let doc: Value = serde_json::from_str(&text).unwrap();
            let headers = headers(&doc);
            assert!(
                headers.iter().any(|(at, _)| at.contains("If-None-Match")),
                "{headers:?}"
            );
            for (at, schema) in headers {
                assert!(!admits_null(&schema), "{} {at}: {schema}", doc["openapi"]);
            }
        }
    }

    /// Every bound the handlers enforce on a single value is in the document, where
    /// clients and schemathesis read it (cross-field rules are in
    /// tests/python/schemathesis_hooks.py).
    #[test]
    fn the_document_states_the_bounds_the_handlers_enforce() {
        use crate::keyspace::MAX_SHARDS;
        let doc: Value = serde_json::from_str(&super::super::openapi_json()).unwrap();
        let at = |pointer: &str| schema(&doc, pointer);
        let shards = at("/components/schemas/PutStream/properties/Shards");
        assert_eq!(shards["minItems"], 1, "{shards}");
        let batch = at("/components/schemas/BatchRequest/properties/accounts");
        assert_eq!(
            (&batch["minItems"], &batch["maxItems"]),
            (&1.into(), &10_000.into())
        );
        let account = at("/components/schemas/AccountId");
        assert_eq!(
            (&account["minLength"], &account["maxLength"]),
            (&1.into(), &256.into())
        );
        assert!(account["pattern"].as_str().unwrap().contains("(?!batch$)"));
        for weight in [
            "/components/schemas/AllocateRequest/properties/weight",
            "/components/schemas/BatchItem/properties/weight",
            "/components/schemas/ReweightRequest/properties/weight",
        ] {
            let w = at(weight);
            assert_eq!(
                (&w["minimum"], &w["maximum"]),
                (&1.into(), &1_000_000.into()),
                "{weight}"
            );
        }
        let count = at("/components/schemas/PutStream/properties/shard_count");
        assert_eq!(
            (&count["minimum"], &count["maximum"]),
            (&1.into(), &MAX_SHARDS.into())
        );
        for (method, path, name, low, high) in [
            ("get", "/keys", "limit", 1, 1000),
            ("get", "/streams", "limit", 1, 1000),
            ("get", "/events", "limit", 1, 1000),
            ("get", "/shard-of", "shards", 1, MAX_SHARDS),
            ("get", "/distribution", "shards", 1, MAX_SHARDS),
            ("get", "/rebalance/preview", "shards", 1, MAX_SHARDS),
            ("get", "/streams/{name}/split-plan", "target", 1, MAX_SHARDS),
        ] {
            let p = param(&doc, method, path, name);
            assert_eq!(
                (&p["minimum"], &p["maximum"]),
                (&low.into(), &high.into()),
                "{path} {name}"
            );
        }
        assert_eq!(param(&doc, "get", "/events", "after")["minimum"], 0);
        assert_eq!(param(&doc, "get", "/keys", "after")["maxLength"], 256);
        assert_eq!(
            param(&doc, "get", "/shard-of", "hash_key")["pattern"],
            "^[0-9]{1,39}$"
        );
        assert_eq!(
            param(&doc, "get", "/keys/{account}", "account")["maxLength"],
            256
        );
        let plan = at("/components/schemas/ApplyRequest/properties/plan_id");
        assert!(plan["pattern"].is_string(), "{plan}");
    }
}
