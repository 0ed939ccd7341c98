#!/usr/bin/env python3
"""Validates both OpenAPI documents and checks that the 3.0 rendition says what 3.1 says.

Usage: check_documents.py OPENAPI_3_1_JSON OPENAPI_3_0_JSON

Each document is validated against its own version of the OpenAPI specification. Then
every schema both documents hold at the same place (a component, a property, array items,
a parameter, a header, a body) judges a panel of values, once under OpenAPI 3.1's rules
and once under 3.0.3's (where `nullable` widens only a `type` beside it): the verdicts
must agree. Prints a summary; exits 1 listing every disagreement.
"""

import json
import sys

from openapi_schema_validator import OAS30Validator, OAS31Validator
from openapi_spec_validator import OpenAPIV30SpecValidator, OpenAPIV31SpecValidator

# Values of every JSON type, around the bounds and patterns the document uses.
PANEL = [
    None,
    "",
    "0",
    "abc",
    "170141183460469231731687303715884105728",
    "held",
    0,
    1,
    -1,
    2.5,
    10**7,
    True,
    [],
    ["0"],
    [None],
    {},
    {"a": 1},
]


def schema_places(doc):
    """JSON pointers of every schema the document holds outside `allOf`/`oneOf`/`anyOf`."""
    places = []

    def schema(pointer, value):
        if not isinstance(value, dict):
            return
        places.append(pointer)
        for name, child in value.get("properties", {}).items():
            schema(f"{pointer}/properties/{escape(name)}", child)
        for key in ("items", "additionalProperties"):
            schema(f"{pointer}/{key}", value.get(key))

    def content(pointer, owner):
        for media, body in owner.get("content", {}).items():
            schema(f"{pointer}/content/{escape(media)}/schema", body.get("schema"))

    for name, value in doc.get("components", {}).get("schemas", {}).items():
        schema(f"/components/schemas/{escape(name)}", value)
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            at = f"/paths/{escape(path)}/{method}"
            for i, parameter in enumerate(operation.get("parameters", [])):
                schema(f"{at}/parameters/{i}/schema", parameter.get("schema"))
            content(f"{at}/requestBody", operation.get("requestBody", {}))
            for status, answer in operation.get("responses", {}).items():
                content(f"{at}/responses/{status}", answer)
                for name, header in answer.get("headers", {}).items():
                    schema(f"{at}/responses/{status}/headers/{escape(name)}/schema", header.get("schema"))
    return places


def escape(key):
    return key.replace("~", "~0").replace("/", "~1")


def resolve(doc, pointer):
    value = doc
    for part in pointer.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def verdicts(validator_class, doc, pointer):
    # The schema by reference, from a root that holds the document's parts, so its own
    # `$ref`s resolve as they do in the document.
    root = {"$ref": f"#{pointer}", "components": doc.get("components", {}), "paths": doc["paths"]}
    validator = validator_class(root)
    return [validator.is_valid(value) for value in PANEL]


def main():
    path_31, path_30 = sys.argv[1:3]
    with open(path_31) as f:
        doc_31 = json.load(f)
    with open(path_30) as f:
        doc_30 = json.load(f)
    OpenAPIV31SpecValidator(doc_31).validate()
    print(f"ok    {path_31} is valid OpenAPI {doc_31['openapi']}")
    OpenAPIV30SpecValidator(doc_30).validate()
    print(f"ok    {path_30} is valid OpenAPI {doc_30['openapi']}")

    places = schema_places(doc_31)
    disagreements = []
    compared = 0
    for pointer in places:
        try:
            resolve(doc_30, pointer)
        except (KeyError, IndexError, TypeError):
            disagreements.append(f"{pointer}: not in the 3.0 rendition")
            continue
        v31 = verdicts(OAS31Validator, doc_31, pointer)
        v30 = verdicts(OAS30Validator, doc_30, pointer)
        compared += 1
        for value, a, b in zip(PANEL, v31, v30):
            if a != b:
                disagreements.append(f"{pointer}: {json.dumps(value)} is {'valid' if a else 'invalid'} in 3.1, "
                                     f"{'valid' if b else 'invalid'} in 3.0")
    if disagreements:
        print("\n".join(disagreements))
        sys.exit(1)
    nulls = sum(verdicts(OAS31Validator, doc_31, p)[0] for p in places)
    print(f"ok    {compared} schemas judge {len(PANEL)} values alike in both ({nulls} of them admit null)")


if __name__ == "__main__":
    main()
