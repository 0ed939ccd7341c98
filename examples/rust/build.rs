//! Generates the keyspread client with progenitor from the committed OpenAPI 3.0 rendition
//! (progenitor reads OpenAPI 3.0 only), into `$OUT_DIR/keyspread.rs`.

use std::path::{Path, PathBuf};

fn main() {
    let document = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../openapi/openapi-3.0.json");
    println!("cargo:rerun-if-changed={}", document.display());
    let text = std::fs::read_to_string(&document)
        .unwrap_or_else(|e| panic!("{}: {e}", document.display()));
    let spec = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not an OpenAPI 3.0 document: {e}", document.display()));
    let tokens = progenitor::Generator::default()
        .generate_tokens(&spec)
        .unwrap_or_else(|e| panic!("progenitor refused {}: {e}", document.display()));
    let code = prettyplease::unparse(&syn::parse2(tokens).expect("progenitor emits Rust"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("keyspread.rs"), code).expect("write the generated client");
}
