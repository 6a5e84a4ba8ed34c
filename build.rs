//! Build script: nothing is generated yet; it only tells cargo when to rerun.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
