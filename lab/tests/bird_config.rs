//! The lab's BIRD configurations, rendered from the shipped examples
//! (`examples/bird.conf`, `examples/bird-router.conf`), are valid BIRD 2:
//! `bird -p` parses each, with and without BFD, so neither the examples
//! nor the lab's rendering can rot. Needs BIRD 2 (`bird2`, which
//! `cargo xtask setup` installs); no root, no namespace.

#![allow(
    unused_crate_dependencies,
    reason = "one dependency list serves the package's library and every target"
)]

use std::{
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
};

use xlb_lab::{bird, topology::Node};

fn bird_binary() -> PathBuf {
    ["/usr/sbin/bird", "/usr/local/sbin/bird"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("BIRD 2 is not installed: install the Debian package bird2 (`cargo xtask setup`)")
}

/// `bird -p -c FILE` on `text`: Ok, or BIRD's complaint. Each call has
/// its own directory: the tests run in parallel, and one removing a shared
/// directory while another creates it made `create_dir_all` fail.
fn parse(name: &str, text: &str) -> Result<(), String> {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("xlb-bird-conf-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let out = Command::new(bird_binary())
        .args(["-p", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn rendered_configurations_parse() {
    for bfd in [false, true] {
        let cases = [
            ("node-a", bird::node_config(Node::A, bfd)),
            ("node-b", bird::node_config(Node::B, bfd)),
            ("router", bird::router_config(bfd)),
        ];
        for (name, text) in cases {
            let text = text.unwrap_or_else(|e| panic!("{name}: {e}"));
            parse(&format!("{name}-{bfd}.conf"), &text)
                .unwrap_or_else(|e| panic!("{name} (bfd {bfd}) does not parse: {e}\n{text}"));
        }
    }
}

#[test]
fn the_examples_parse_as_shipped() {
    for (name, text) in [
        ("bird.conf", bird::NODE_EXAMPLE),
        ("bird-router.conf", bird::ROUTER_EXAMPLE),
    ] {
        parse(name, text).unwrap_or_else(|e| panic!("examples/{name} does not parse: {e}"));
    }
}

#[test]
fn a_broken_configuration_is_refused() {
    // The check above can fail: BIRD does refuse what it cannot parse.
    let text = bird::node_config(Node::A, false)
        .unwrap()
        .replace("next hop self;", "next hop sefl;");
    assert!(parse("broken.conf", &text).is_err());
}
