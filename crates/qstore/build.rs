//! Builds the experiment specs of `experiments/*.toml` into the binary, so that
//! `qstore figure NAME` works wherever the binary is; a spec added to the folder is listed
//! by `qstore figure --list` after the next build.

use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut specs: Vec<(String, String)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .map(|p| {
                    let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                    let path = p.canonicalize().unwrap().to_string_lossy().into_owned();
                    (name, path)
                })
                .collect()
        })
        .unwrap_or_default();
    specs.sort();
    let mut code = String::from("/// The built-in experiment specs: (name, TOML text).\n");
    code.push_str("pub const SPECS: &[(&str, &str)] = &[\n");
    for (name, path) in &specs {
        code.push_str(&format!("    ({name:?}, include_str!({path:?})),\n"));
    }
    code.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("specs.rs");
    std::fs::write(out, code).unwrap();
}
