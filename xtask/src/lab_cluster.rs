//! `cargo xtask lab up --nodes 2 [--bfd]`: the two-node lab (issue 26),
//! a router running BIRD with ECMP in front of node A and node B, each
//! running `xlb run` and BIRD, left running for hands-on use. The
//! orchestration is `xlb_lab::scenario::ClusterRun`, shared with the
//! cluster tests; `lab down` tears it down like the one-node lab (plus
//! node B's instance).

use std::path::Path;

use anyhow::{Context as _, Result};
use xlb_lab::{
    scenario::{self, ClusterOptions, ClusterRun, LabRun, XlbConfig},
    topology::{self, Node},
};

use crate::lab::{Paths, UpArgs, build_then_become_root, short, sudo_prefix};

pub(crate) fn up(args: &UpArgs) -> Result<()> {
    let paths = Paths::find()?;
    let config = match &args.config {
        Some(path) => anyhow::bail!(
            "--config {} with --nodes 2: the two-node lab generates both nodes' configurations \
             (same VIPs and hash_seed, an instance each); drop --config",
            path.display()
        ),
        None => XlbConfig::lab_default(&args.prefix, args.mode, 3),
    };
    let release = !args.dev;
    build_then_become_root(
        "the lab (network namespaces, XDP programs, BIRD)",
        Some(release),
    )?;
    let xlb = paths.bin(release, "xlb");
    let dir = paths.lab_dir(&args.prefix);
    remove_previous(&args.prefix, &dir, &xlb)?;
    println!(
        "lab: bringing up {p:?} with two nodes (namespaces {p}-br, {p}-cl, {p}-rt, {p}-lb, \
         {p}-lb2, {p}-b1..b3){bfd}",
        p = args.prefix,
        bfd = if args.bfd { ", BFD 100 ms x 3" } else { "" },
    );
    let mut opts = ClusterOptions::new(&args.prefix, &xlb);
    opts.config = config;
    opts.bfd = args.bfd;
    opts.work_dir = Some(dir.clone());
    opts.start_daemons = !args.no_daemon;
    let run = ClusterRun::up(&opts).with_context(|| {
        format!(
            "bringing up the two-node lab (logs in {}; `cargo xtask lab down --prefix {}` cleans up)",
            short(&dir),
            args.prefix
        )
    })?;
    if !args.no_daemon {
        for vip in [topology::VIP_V4.into(), topology::VIP_V6.into()] {
            run.wait_router(vip, &[Node::A, Node::B], std::time::Duration::from_secs(10))
                .with_context(|| format!("both nodes announcing {vip}"))?;
        }
        println!(
            "\n{}",
            run.birdc(scenario::Speaker::Router, &["show", "route"])?
        );
    }
    let text = instructions(&args.prefix, &xlb, &run);
    run.keep();
    println!("{text}");
    Ok(())
}

/// Whatever ran under this prefix, one node or two.
pub(crate) fn remove_previous(prefix: &str, dir: &Path, xlb: &Path) -> Result<()> {
    LabRun::down(prefix, dir, xlb, &scenario::instance_for(prefix))
        .with_context(|| format!("removing the previous lab {prefix:?}"))?;
    detach_node_b(prefix, xlb)
}

/// `xlb detach` of node B's instance (nothing if there is none).
pub(crate) fn detach_node_b(prefix: &str, xlb: &Path) -> Result<()> {
    if xlb.is_file() {
        scenario::detach(xlb, &scenario::node_b_instance(prefix))
            .with_context(|| format!("detaching node B of lab {prefix:?}"))?;
    }
    let _ = std::fs::remove_file(scenario::node_b_socket(prefix));
    Ok(())
}

/// What `lab up --nodes 2` prints: how to reach the lab and break a node.
fn instructions(p: &str, xlb: &Path, run: &ClusterRun) -> String {
    let s = sudo_prefix();
    let xlb = short(xlb);
    let dir = short(run.run().work_dir());
    let sock = |n: Node| run.socket(n).display().to_string();
    let ctl = |n: Node| run.bird_files(scenario::Speaker::Node(n)).ctl;
    format!(
        "two-node lab {p:?} is up; logs, configurations and state in {dir}/\n\n\
         try it (through the router, ECMP over both nodes):\n\
         \x20 {s}ip netns exec {p}-cl curl http://10.100.0.1/api\n\
         the router's routes and BGP sessions:\n\
         \x20 {s}ip -n {p}-rt route show 10.100.0.1\n\
         \x20 {s}birdc -s {rt} show protocols\n\
         each node:\n\
         \x20 {s}{xlb} status --socket {a}\n\
         \x20 {s}{xlb} status --socket {b}\n\
         \x20 {s}birdc -s {bird_a} show route\n\
         take node A's link to the router down and up again (on the bridge):\n\
         \x20 {s}ip netns exec {p}-br nft add table bridge xlb_silence_v_lb \\; add chain bridge xlb_silence_v_lb silence '{{ type filter hook forward priority -10; }}' \\; add rule bridge xlb_silence_v_lb silence iifname v-rt oifname v-lb drop \\; add rule bridge xlb_silence_v_lb silence iifname v-lb oifname v-rt drop\n\
         \x20 {s}ip netns exec {p}-br nft delete table bridge xlb_silence_v_lb\n\
         tear it down:\n  cargo xtask lab down --prefix {p}\n",
        rt = run.bird_files(scenario::Speaker::Router).ctl.display(),
        a = sock(Node::A),
        b = sock(Node::B),
        bird_a = ctl(Node::A).display(),
    )
}
