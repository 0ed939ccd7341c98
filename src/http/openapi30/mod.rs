//! The OpenAPI 3.0.3 rendition of the document, for generators that read 3.0 only.
//!
//! Every schema keeps its meaning under 3.0.3's rules, where `nullable` only widens a
//! `type` beside it and a schema without `type` admits null. What 3.0 cannot say is an
//! error rather than something quietly dropped.

use serde_json::{Map, Value, json};

use schema::schema;

mod schema;

/// Something in the 3.1 document that OpenAPI 3.0 has no way to say.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{at}: {what} has no OpenAPI 3.0 form")]
pub struct Untranslatable {
    /// JSON pointer of the part.
    pub at: String,
    /// The keyword or construct.
    pub what: String,
}

type Result<T = ()> = std::result::Result<T, Untranslatable>;

/// Converts one part of the document in place; the `&str` is where it is.
type Convert = fn(&mut Value, &str) -> Result;

/// The OpenAPI 3.1 document `doc`, said in OpenAPI 3.0.3.
pub fn downgrade(mut doc: Value) -> Result<Value> {
    let root = object(&mut doc, "")?;
    match root.get("openapi").and_then(Value::as_str) {
        Some(version) if version.starts_with("3.1.") => {}
        other => return Err(untranslatable("/openapi", format!("version {other:?}"))),
    }
    root.insert("openapi".into(), "3.0.3".into());
    for only_31 in ["webhooks", "jsonSchemaDialect"] {
        refuse(root, "", only_31)?;
    }
    if let Some(info) = root.get_mut("info") {
        info_object(object(info, "/info")?)?;
    }
    // 3.0 requires `paths`, 3.1 does not.
    let paths = root.entry("paths").or_insert_with(|| json!({}));
    for (path, item) in object(paths, "/paths")? {
        path_item(item, &format!("/paths/{}", escape(path)))?;
    }
    if let Some(components) = root.get_mut("components") {
        components_object(object(components, "/components")?)?;
    }
    drop_role_lists(&mut doc);
    Ok(doc)
}

/// 3.1 lets a requirement of an `http` or `apiKey` scheme list the roles it needs; 3.0 wants
/// that list empty (only OAuth 2 and OpenID Connect list scopes). The role stays in each
/// operation's `x-keyspread-role`.
fn drop_role_lists(doc: &mut Value) {
    let Some(schemes) = doc
        .pointer("/components/securitySchemes")
        .and_then(Value::as_object)
    else {
        return;
    };
    let roleless: Vec<String> = schemes
        .iter()
        .filter(|(_, scheme)| matches!(scheme["type"].as_str(), Some("http" | "apiKey")))
        .map(|(name, _)| name.clone())
        .collect();
    let empty_roles = |list: &mut Value| {
        for requirement in list.as_array_mut().into_iter().flatten() {
            for (name, roles) in requirement.as_object_mut().into_iter().flatten() {
                if roleless.contains(name) {
                    *roles = json!([]);
                }
            }
        }
    };
    if let Some(security) = doc.get_mut("security") {
        empty_roles(security);
    }
    if let Some(Value::Object(paths)) = doc.get_mut("paths") {
        for item in paths.values_mut() {
            for method in METHODS {
                if let Some(security) = item.get_mut(method).and_then(|o| o.get_mut("security")) {
                    empty_roles(security);
                }
            }
        }
    }
}

/// 3.1 names a licence by SPDX `identifier`; 3.0 by `url`, here the SPDX page.
fn info_object(info: &mut Map<String, Value>) -> Result {
    refuse(info, "/info", "summary")?;
    if let Some(license) = info.get_mut("license") {
        let license = object(license, "/info/license")?;
        if let Some(id) = license.remove("identifier") {
            let id = id.as_str().unwrap_or_default();
            license
                .entry("url")
                .or_insert_with(|| format!("https://spdx.org/licenses/{id}.html").into());
        }
    }
    Ok(())
}

fn components_object(components: &mut Map<String, Value>) -> Result {
    refuse(components, "/components", "pathItems")?;
    let kinds: [(&str, Convert); 5] = [
        ("schemas", schema),
        ("parameters", parameter),
        ("requestBodies", request_body),
        ("responses", response),
        ("headers", header),
    ];
    for (kind, convert) in kinds {
        if let Some(all) = components.get_mut(kind) {
            let at = format!("/components/{kind}");
            for (name, part) in object(all, &at)? {
                convert(part, &format!("{at}/{}", escape(name)))?;
            }
        }
    }
    if let Some(schemes) = components.get_mut("securitySchemes") {
        for (name, scheme) in object(schemes, "/components/securitySchemes")? {
            if scheme["type"] == "mutualTLS" {
                let at = format!("/components/securitySchemes/{}", escape(name));
                return Err(untranslatable(&at, "security scheme type mutualTLS"));
            }
        }
    }
    Ok(())
}

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn path_item(item: &mut Value, at: &str) -> Result {
    let item = object(item, at)?;
    if item.contains_key("$ref") {
        return reference(item, at);
    }
    each_parameter(item, at)?;
    for method in METHODS {
        if let Some(operation) = item.get_mut(method) {
            operation_object(object(operation, &format!("{at}/{method}"))?, method, at)?;
        }
    }
    Ok(())
}

fn operation_object(operation: &mut Map<String, Value>, method: &str, path: &str) -> Result {
    let at = format!("{path}/{method}");
    each_parameter(operation, &at)?;
    if let Some(body) = operation.get_mut("requestBody") {
        request_body(body, &format!("{at}/requestBody"))?;
    }
    if let Some(responses) = operation.get_mut("responses") {
        for (status, answer) in object(responses, &format!("{at}/responses"))? {
            response(answer, &format!("{at}/responses/{status}"))?;
        }
    }
    if let Some(callbacks) = operation.get_mut("callbacks") {
        for (name, callback) in object(callbacks, &format!("{at}/callbacks"))? {
            let callback_at = format!("{at}/callbacks/{}", escape(name));
            for (expression, item) in object(callback, &callback_at)? {
                path_item(item, &format!("{callback_at}/{}", escape(expression)))?;
            }
        }
    }
    Ok(())
}

fn each_parameter(owner: &mut Map<String, Value>, at: &str) -> Result {
    if let Some(Value::Array(parameters)) = owner.get_mut("parameters") {
        for (i, p) in parameters.iter_mut().enumerate() {
            parameter(p, &format!("{at}/parameters/{i}"))?;
        }
    }
    Ok(())
}

/// A parameter and a header are alike: a schema, or content by media type.
fn parameter(p: &mut Value, at: &str) -> Result {
    let p = object(p, at)?;
    if p.contains_key("$ref") {
        return reference(p, at);
    }
    if let Some(s) = p.get_mut("schema") {
        schema(s, &format!("{at}/schema"))?;
    }
    each_media_type(p, at)
}

fn header(h: &mut Value, at: &str) -> Result {
    parameter(h, at)
}

fn request_body(body: &mut Value, at: &str) -> Result {
    let body = object(body, at)?;
    if body.contains_key("$ref") {
        return reference(body, at);
    }
    each_media_type(body, at)
}

fn response(answer: &mut Value, at: &str) -> Result {
    let answer = object(answer, at)?;
    if answer.contains_key("$ref") {
        return reference(answer, at);
    }
    if let Some(headers) = answer.get_mut("headers") {
        let headers_at = format!("{at}/headers");
        for (name, h) in object(headers, &headers_at)? {
            header(h, &format!("{headers_at}/{}", escape(name)))?;
        }
    }
    each_media_type(answer, at)
}

fn each_media_type(owner: &mut Map<String, Value>, at: &str) -> Result {
    let Some(content) = owner.get_mut("content") else {
        return Ok(());
    };
    for (media, body) in object(content, &format!("{at}/content"))? {
        let media_at = format!("{at}/content/{}", escape(media));
        let body = object(body, &media_at)?;
        if let Some(s) = body.get_mut("schema") {
            schema(s, &format!("{media_at}/schema"))?;
        }
        if let Some(encodings) = body.get_mut("encoding") {
            for (name, encoding) in object(encodings, &format!("{media_at}/encoding"))? {
                let encoding_at = format!("{media_at}/encoding/{}", escape(name));
                if let Some(headers) = object(encoding, &encoding_at)?.get_mut("headers") {
                    for (h_name, h) in object(headers, &format!("{encoding_at}/headers"))? {
                        header(h, &format!("{encoding_at}/headers/{}", escape(h_name)))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// A Reference Object outside schemas: 3.1 lets it carry a `summary` and `description`
/// that replace the target's; 3.0 would ignore them.
fn reference(r: &Map<String, Value>, at: &str) -> Result {
    match r.keys().find(|k| *k != "$ref") {
        Some(extra) => Err(untranslatable(at, format!("`{extra}` beside `$ref`"))),
        None => Ok(()),
    }
}

fn object<'a>(value: &'a mut Value, at: &str) -> Result<&'a mut Map<String, Value>> {
    value
        .as_object_mut()
        .ok_or_else(|| untranslatable(at, "a part that is not an object"))
}

fn refuse(map: &Map<String, Value>, at: &str, key: &str) -> Result {
    if map.contains_key(key) {
        return Err(untranslatable(at, format!("`{key}`")));
    }
    Ok(())
}

fn untranslatable(at: &str, what: impl Into<String>) -> Untranslatable {
    Untranslatable {
        at: if at.is_empty() { "/".into() } else { at.into() },
        what: what.into(),
    }
}

/// A key as a JSON pointer segment (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{Untranslatable, downgrade};

    /// A 3.1 document holding `schema` as component `S`.
    pub(super) fn holding(schema: Value) -> Value {
        json!({
            "openapi": "3.1.0",
            "info": {"title": "t", "version": "1"},
            "paths": {},
            "components": {"schemas": {"S": schema}},
        })
    }

    fn refused(schema: Value) -> Untranslatable {
        downgrade(holding(schema)).expect_err("has no 3.0 form")
    }

    #[test]
    fn the_document_around_the_schemas() {
        let doc = json!({
            "openapi": "3.1.0",
            "info": {"title": "t", "version": "1",
                     "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}},
            "paths": {"/a/{id}": {
                "parameters": [{"name": "id", "in": "path", "required": true,
                                "schema": {"type": ["string", "null"]}}],
                "get": {
                    "parameters": [{"name": "h", "in": "header", "schema": {"const": 1}}],
                    "requestBody": {"content": {"application/json": {"schema": {"type": "null"}}}},
                    "responses": {"200": {
                        "description": "ok",
                        "headers": {"ETag": {"schema": {"type": ["string", "null"]}}},
                        "content": {"application/json": {"schema": {"examples": [1]}}},
                    }},
                },
            }},
        });
        let got = downgrade(doc).unwrap();
        assert_eq!(got["openapi"], "3.0.3");
        assert_eq!(
            got["info"]["license"],
            json!({"name": "Apache-2.0", "url": "https://spdx.org/licenses/Apache-2.0.html"})
        );
        let item = &got["paths"]["/a/{id}"];
        assert_eq!(
            item["parameters"][0]["schema"],
            json!({"type": "string", "nullable": true})
        );
        let get = &item["get"];
        assert_eq!(get["parameters"][0]["schema"], json!({"enum": [1]}));
        assert_eq!(
            get["requestBody"]["content"]["application/json"]["schema"],
            json!({"enum": [null]})
        );
        let ok = &get["responses"]["200"];
        assert_eq!(
            ok["headers"]["ETag"]["schema"],
            json!({"type": "string", "nullable": true})
        );
        assert_eq!(
            ok["content"]["application/json"]["schema"],
            json!({"example": 1})
        );
    }

    #[test]
    fn what_3_0_cannot_say_is_refused() {
        let at = |e: Untranslatable| (e.at, e.what);
        assert_eq!(
            at(refused(json!({"type": ["string", "integer"]}))),
            (
                "/components/schemas/S".into(),
                r#"type ["string","integer"]"#.into()
            )
        );
        assert_eq!(
            at(refused(
                json!({"properties": {"a~b/c": {"patternProperties": {}}}})
            )),
            (
                "/components/schemas/S/properties/a~0b~1c".into(),
                "`patternProperties`".into()
            )
        );
        assert_eq!(refused(json!({"prefixItems": []})).what, "`prefixItems`");
        assert_eq!(
            refused(json!({"contentMediaType": "image/png"})).what,
            "`contentMediaType`"
        );
        let mut webhooks = holding(json!({}));
        webhooks["webhooks"] = json!({});
        assert_eq!(downgrade(webhooks).unwrap_err().what, "`webhooks`");
        let mut old = holding(json!({}));
        old["openapi"] = "3.0.3".into();
        assert!(downgrade(old).is_err());
    }

    /// The served document converts, and nothing of 3.1 is left in it.
    #[test]
    fn the_document_has_a_3_0_rendition() {
        let doc: Value = serde_json::from_str(&crate::http::openapi_30_json()).unwrap();
        assert_eq!(doc["openapi"], "3.0.3");
        let mut left = Vec::new();
        only_30(&doc, "", &mut left);
        assert!(left.is_empty(), "3.1 forms left: {left:#?}");
        // What the conversion is for: these were `type: [X, "null"]` and `oneOf` with null.
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["LeaseBody"]["properties"]["checkpoint"]["nullable"],
            true
        );
        assert_eq!(
            schemas["StreamChange"]["properties"]["before_skew"]["oneOf"][0],
            json!({"enum": [null]})
        );
        assert_eq!(
            schemas["HashKey"]["example"],
            "170141183460469231731687303715884105728"
        );
    }

    /// Every place in `v` (at JSON pointer `at`) that has a 3.1-only form.
    fn only_30(v: &Value, at: &str, left: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                let kind = &map.get("type");
                if kind.is_some_and(|t| t.is_array() || *t == "null") {
                    left.push(format!("{at}/type"));
                }
                if map.contains_key("$ref") && map.len() > 1 {
                    left.push(format!("{at}: $ref with siblings"));
                }
                if map.get("examples").is_some_and(Value::is_array) {
                    left.push(format!("{at}/examples"));
                }
                if map.contains_key("const") || map.contains_key("identifier") {
                    left.push(format!("{at}: const or identifier"));
                }
                for (k, child) in map {
                    only_30(child, &format!("{at}/{k}"), left);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    only_30(child, &format!("{at}/{i}"), left);
                }
            }
            _ => {}
        }
    }
}
