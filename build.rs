//! The image's build (`cargo build --profile dist`) gathers the functions a sidecar runs into one
//! stretch of `.text` (`benches/perf/hot_text.ld`, written by `benches/perf/hop.sh order`): the
//! pages a sidecar touches are its resident code, and scattered they cost several MiB of idle
//! RSS (docs/development.md#hot-text). Only `dist`: the list is made from that build's profile,
//! and a newcomer's `release` or `cargo bench` build does without it. `REACH_HOT_TEXT=0` turns it
//! off there too.

use std::env;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=benches/perf/hot_text.ld");
    println!("cargo:rerun-if-env-changed=REACH_HOT_TEXT");
    let linux = env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let off = env::var("REACH_HOT_TEXT").is_ok_and(|v| v == "0");
    let (Ok(root), Ok(out)) = (env::var("CARGO_MANIFEST_DIR"), env::var("OUT_DIR")) else {
        return;
    };
    // Cargo names no profile to a build script; its output is `<target>/<profile>/build/<pkg>/out`.
    let profile = Path::new(&out).ancestors().nth(3).and_then(Path::file_name);
    let dist = profile.is_some_and(|p| p == "dist");
    let script = Path::new(&root).join("benches/perf/hot_text.ld");
    if dist && linux && !off && script.exists() {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
    }
}
