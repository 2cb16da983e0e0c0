use which::which;

/// Building this crate needs the `bpf-linker` binary, which cargo cannot
/// express as a dependency; rebuild when it changes (as aya-template does).
fn main() {
    println!("cargo:rustc-link-arg-bins=--cpu-features=+allows-misaligned-mem-access");
    match which("bpf-linker") {
        Ok(p) => println!("cargo:rerun-if-changed={}", p.display()),
        Err(_) => println!(
            "cargo:warning=bpf-linker not found on PATH: run `cargo xtask setup` to install it"
        ),
    }
}
