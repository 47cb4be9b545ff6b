//! Writes the test model (`crates/proxy/assets/test-model/`): trains `tokenizer.json` on
//! `testdata/tokenizer_corpus.txt` and writes `tokenizer_config.json` around
//! `testdata/templates/test_model.jinja`.
//!
//! Run: `cargo run -p gyre-proxy --example train_test_tokenizer`. It is deterministic; the test
//! `test_model::assets_are_reproducible` fails if the files and this script disagree.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = std::fs::read_to_string(crate_dir.join("testdata/tokenizer_corpus.txt"))?;
    let template = std::fs::read_to_string(crate_dir.join("testdata/templates/test_model.jinja"))?;
    let out = crate_dir.join("assets/test-model");
    std::fs::create_dir_all(&out)?;
    let tokenizer = gyre_proxy::test_model::train_tokenizer(&corpus)?;
    std::fs::write(out.join("tokenizer.json"), tokenizer)?;
    std::fs::write(
        out.join("tokenizer_config.json"),
        gyre_proxy::test_model::tokenizer_config(&template),
    )?;
    println!("wrote {}", out.display());
    Ok(())
}
