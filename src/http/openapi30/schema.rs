//! Schemas: JSON Schema 2020-12 as the 3.0.3 Schema Object says it.

use serde_json::{Map, Value, json};

use super::{Result, escape, object, refuse, untranslatable};

/// Schema keywords of JSON Schema 2020-12 that the 3.0 Schema Object lacks.
const SCHEMA_ONLY_31: [&str; 20] = [
    "$id",
    "$schema",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$defs",
    "$comment",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependentRequired",
    "unevaluatedItems",
    "unevaluatedProperties",
    "propertyNames",
    "patternProperties",
];

/// Media keywords 3.0 says with `format` instead; no schema here uses them.
const CONTENT_ONLY_31: [&str; 3] = ["contentMediaType", "contentEncoding", "contentSchema"];

/// A schema, and every schema inside it.
pub(super) fn schema(s: &mut Value, at: &str) -> Result {
    // 3.0 knows no boolean schemas: `true` admits anything, `false` nothing.
    if let Value::Bool(admits) = *s {
        *s = if admits {
            json!({})
        } else {
            json!({"not": {}})
        };
        return Ok(());
    }
    let map = object(s, at)?;
    for only_31 in SCHEMA_ONLY_31.iter().chain(&CONTENT_ONLY_31) {
        refuse(map, at, only_31)?;
    }
    // 3.0 ignores whatever sits beside `$ref`: wrap the reference so they count.
    if map.contains_key("$ref") && map.len() > 1 {
        let target = json!({ "$ref": map.remove("$ref").expect("checked above") });
        match map.get_mut("allOf") {
            Some(Value::Array(all)) => all.insert(0, target),
            _ => {
                map.insert("allOf".into(), json!([target]));
            }
        }
    }
    if let Some(value) = map.remove("const") {
        if map.contains_key("enum") {
            return Err(untranslatable(at, "`const` beside `enum`"));
        }
        map.insert("enum".into(), json!([value]));
    }
    if let Some(examples) = map.remove("examples") {
        let first = examples.as_array().and_then(|all| all.first()).cloned();
        if let (Some(first), false) = (first, map.contains_key("example")) {
            map.insert("example".into(), first);
        }
    }
    for (exclusive, bound) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        exclusive_bound(map, at, exclusive, bound)?;
    }
    nullable_type(map, at)?;
    // 3.0 requires `items` beside `type: array`; left out in 3.1 it admits any item.
    if map.get("type").is_some_and(|t| t == "array") && !map.contains_key("items") {
        map.insert("items".into(), json!({}));
    }
    children(map, at)?;
    null_branches(map);
    Ok(())
}

/// 3.1 writes an exclusive bound as the number itself; 3.0 as the bound plus `true`.
fn exclusive_bound(map: &mut Map<String, Value>, at: &str, exclusive: &str, bound: &str) -> Result {
    if let Some(limit) = map.get(exclusive).filter(|v| v.is_number()).cloned() {
        if map.contains_key(bound) {
            return Err(untranslatable(
                at,
                format!("`{exclusive}` beside `{bound}`"),
            ));
        }
        map.insert(bound.into(), limit);
        map.insert(exclusive.into(), true.into());
    }
    Ok(())
}

/// `type: [X, "null"]` is `type: X, nullable: true`; the type null alone is the one value
/// null, which a 3.0.3 schema says as `enum: [null]` (a schema without `type` admits null).
fn nullable_type(map: &mut Map<String, Value>, at: &str) -> Result {
    let Some(kind) = map.get("type").cloned() else {
        return Ok(());
    };
    let kinds = match &kind {
        Value::String(_) => vec![kind.clone()],
        Value::Array(all) => all.clone(),
        _ => return Err(untranslatable(at, format!("type {kind}"))),
    };
    let null = Value::from("null");
    let (nulls, others): (Vec<_>, Vec<_>) = kinds.into_iter().partition(|k| *k == null);
    match (others.as_slice(), nulls.is_empty()) {
        ([one], true) => {
            map.insert("type".into(), one.clone());
        }
        ([one], false) => {
            map.insert("type".into(), one.clone());
            map.insert("nullable".into(), true.into());
        }
        ([], false) => {
            map.remove("type");
            if map.contains_key("enum") {
                return Err(untranslatable(at, "`enum` beside type null"));
            }
            map.insert("enum".into(), json!([null]));
        }
        _ => return Err(untranslatable(at, format!("type {kind}"))),
    }
    Ok(())
}

/// Converts the schemas a schema holds.
fn children(map: &mut Map<String, Value>, at: &str) -> Result {
    for single in ["items", "not", "additionalProperties"] {
        match map.get_mut(single) {
            // `additionalProperties: false` stays: 3.0 has it.
            Some(Value::Bool(_)) if single == "additionalProperties" => {}
            Some(Value::Array(_)) => {
                return Err(untranslatable(at, format!("`{single}` as a list")));
            }
            Some(child) => schema(child, &format!("{at}/{single}"))?,
            None => {}
        }
    }
    if let Some(properties) = map.get_mut("properties") {
        for (name, child) in object(properties, &format!("{at}/properties"))? {
            schema(child, &format!("{at}/properties/{}", escape(name)))?;
        }
    }
    for many in ["allOf", "oneOf", "anyOf"] {
        if let Some(Value::Array(branches)) = map.get_mut(many) {
            for (i, child) in branches.iter_mut().enumerate() {
                schema(child, &format!("{at}/{many}/{i}"))?;
            }
        }
    }
    Ok(())
}

/// `oneOf`/`anyOf` of null and one typed schema: the same schema with `nullable`, the form
/// generators read as an optional value. Runs on converted branches (null is `enum: [null]`).
fn null_branches(map: &mut Map<String, Value>) {
    for many in ["oneOf", "anyOf"] {
        let Some(Value::Array(branches)) = map.get(many) else {
            continue;
        };
        let (nulls, others): (Vec<&Value>, Vec<&Value>) =
            branches.iter().partition(|b| is_only_null(b));
        let ([other], false) = (others.as_slice(), nulls.is_empty()) else {
            continue;
        };
        let Some(other) = other
            .as_object()
            .filter(|o| o.get("type").is_some_and(Value::is_string))
        else {
            continue;
        };
        // A subschema of the other might refuse null where the null branch admitted it.
        let applies = ["not", "allOf", "oneOf", "anyOf"];
        if other.contains_key("nullable")
            || other
                .keys()
                .any(|k| map.contains_key(k) || applies.contains(&k.as_str()))
        {
            continue;
        }
        let mut merged = other.clone();
        // The null branch admitted null whatever the other's `enum` says.
        if let Some(Value::Array(values)) = merged.get_mut("enum")
            && !values.contains(&Value::Null)
        {
            values.push(Value::Null);
        }
        merged.insert("nullable".into(), true.into());
        map.remove(many);
        map.extend(merged);
        return;
    }
}

/// `{"enum": [null]}`, give or take annotations: admits null and nothing else.
fn is_only_null(branch: &Value) -> bool {
    branch["enum"] == json!([null])
        && branch.as_object().is_some_and(|o| {
            o.keys()
                .all(|k| ["enum", "description", "title"].contains(&k.as_str()))
        })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::http::openapi30::downgrade;
    use crate::http::openapi30::tests::holding;

    /// Component `S` of the 3.0 rendition of a document holding `schema`.
    fn converted(schema: Value) -> Value {
        let doc = downgrade(holding(schema)).expect("converts");
        assert_eq!(doc["openapi"], "3.0.3");
        doc["components"]["schemas"]["S"].clone()
    }

    #[test]
    fn a_type_list_with_null_is_a_nullable_type() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": ["integer", "null"], "format": "int64", "minimum": 1},
            "b": {"type": ["null", "array"], "items": {"type": ["string", "null"]}},
            "c": {"type": "string"},
        }});
        assert_eq!(
            converted(s),
            json!({"type": "object", "properties": {
                "a": {"type": "integer", "nullable": true, "format": "int64", "minimum": 1},
                "b": {"type": "array", "nullable": true, "items": {"type": "string", "nullable": true}},
                "c": {"type": "string"},
            }})
        );
    }

    #[test]
    fn null_or_a_reference_stays_a_choice_with_null_said_as_enum() {
        // `nullable` beside no `type` admits nothing more under 3.0.3: keep the choice.
        let s = json!({"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/T"}]});
        assert_eq!(
            converted(s),
            json!({"oneOf": [{"enum": [null]}, {"$ref": "#/components/schemas/T"}]})
        );
        let s = json!({"anyOf": [{"$ref": "#/components/schemas/T", "description": "d"}, {"type": "null"}]});
        assert_eq!(
            converted(s),
            json!({"anyOf": [
                {"description": "d", "allOf": [{"$ref": "#/components/schemas/T"}]},
                {"enum": [null]},
            ]})
        );
    }

    #[test]
    fn null_or_one_typed_schema_is_that_schema_made_nullable() {
        let s = json!({"description": "d", "oneOf": [
            {"type": "null"},
            {"type": "string", "enum": ["a", "b"], "maxLength": 3},
        ]});
        assert_eq!(
            converted(s),
            json!({"description": "d", "type": "string", "enum": ["a", "b", null], "maxLength": 3,
                   "nullable": true})
        );
        // An applicator inside could refuse null: the choice stays.
        let guarded =
            json!({"oneOf": [{"type": "null"}, {"type": "string", "not": {"enum": ["x"]}}]});
        assert_eq!(
            converted(guarded),
            json!({"oneOf": [{"enum": [null]}, {"type": "string", "not": {"enum": ["x"]}}]})
        );
        // Two others: still a choice, null said as 3.0 can.
        let s = json!({"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "integer"}]});
        assert_eq!(
            converted(s),
            json!({"oneOf": [{"enum": [null]}, {"type": "string"}, {"type": "integer"}]})
        );
    }

    #[test]
    fn keywords_3_0_spells_otherwise() {
        let s = json!({"type": "object", "properties": {
            "k": {"type": "string", "examples": ["1", "2"], "pattern": "^[0-9]+$"},
            "c": {"const": "fixed"},
            "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5},
            "r": {"$ref": "#/components/schemas/T", "description": "why"},
            "any": true,
            "none": false,
            "l": {"type": "array"},
        }, "additionalProperties": false});
        assert_eq!(
            converted(s),
            json!({"type": "object", "properties": {
                "k": {"type": "string", "pattern": "^[0-9]+$", "example": "1"},
                "c": {"enum": ["fixed"]},
                "x": {"type": "number", "exclusiveMinimum": true, "exclusiveMaximum": true,
                      "minimum": 0, "maximum": 1.5},
                "r": {"description": "why", "allOf": [{"$ref": "#/components/schemas/T"}]},
                "any": {},
                "none": {"not": {}},
                "l": {"type": "array", "items": {}},
            }, "additionalProperties": false})
        );
    }
}
