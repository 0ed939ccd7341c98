//! Both OpenAPI documents are valid, each against its own version of the specification, and
//! the 3.0 rendition's schemas judge values exactly as the 3.1 document's do.

use std::path::Path;
use std::process::Command;

use crate::python_client::{assert_success, tool};

#[test]
fn both_documents_are_valid_and_say_the_same() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    let checked = Command::new(python)
        .arg(manifest.join("tests/python/check_documents.py"))
        .arg(manifest.join("openapi/openapi.json"))
        .arg(manifest.join("openapi/openapi-3.0.json"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run check_documents.py");
    assert_success("check_documents.py", &checked);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    print!("{stdout}");
    for told in [
        "is valid OpenAPI 3.1.0",
        "is valid OpenAPI 3.0.3",
        "values alike in both",
    ] {
        assert!(
            stdout.contains(told),
            "check_documents.py never said {told:?}"
        );
    }
}
