//! Optimised builds of the binary gather the functions a sidecar runs into one stretch of
//! `.text` (`benches/perf/hot_text.ld`, written by `benches/perf/hop.sh order`): the pages a sidecar
//! touches are its resident code, and scattered they cost several MiB of idle RSS
//! (docs/development.md#hot-text). `REACH_HOT_TEXT=0` builds without it.

use std::env;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=benches/perf/hot_text.ld");
    println!("cargo:rerun-if-env-changed=REACH_HOT_TEXT");
    let optimised = env::var("PROFILE").is_ok_and(|p| p == "release");
    let linux = env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let off = env::var("REACH_HOT_TEXT").is_ok_and(|v| v == "0");
    let Ok(root) = env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let script = Path::new(&root).join("benches/perf/hot_text.ld");
    if optimised && linux && !off && script.exists() {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
    }
}
