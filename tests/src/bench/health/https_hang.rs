//! Part of figure `https` (issue 25): how fast a `kind = "https"` check
//! takes out a hung TLS server, at the default and the fast profile,
//! against three real `openssl s_server -www` processes on 127.0.0.1
//! (certificates of the lab CA from `tests/tls/make-certs.sh`, verified
//! with that CA as `ca_file` against the IP address, as an operator would
//! configure it). A SIGSTOPped s_server still has the kernel complete TCP
//! handshakes, so only the TLS handshake and the HTTP answer tell.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use lb_user::health::spec::{CheckSpec, Via};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::{
    fleet::{Fleet, detection},
    report::Row,
};
use crate::tls::LabCerts;

/// Three s_server processes, killed (and reaped) on drop.
struct Servers {
    children: Vec<Child>,
    addrs: Vec<SocketAddr>,
}

impl Servers {
    fn start(certs: &LabCerts) -> Result<Self> {
        let mut servers = Self {
            children: Vec::new(),
            addrs: Vec::new(),
        };
        for _ in 0..3 {
            // A port free now; s_server binds it at once.
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            let child = Command::new("openssl")
                .args(certs.s_server_args("good", port))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("starting openssl s_server (apt-get install openssl)")?;
            servers.children.push(child);
            servers
                .addrs
                .push(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for &addr in &servers.addrs {
            while TcpStream::connect(addr).is_err() {
                ensure!(
                    Instant::now() < deadline,
                    "s_server on {addr} does not accept"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(servers)
    }
}

impl Fleet for Servers {
    fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    fn signal(&self, i: usize, sig: Signal) -> Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.children[i].id())?);
        kill(pid, sig).with_context(|| format!("kill -{sig} s_server {i}"))
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            // A stopped process dies of SIGKILL too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The https check a `[health_check]` with `extra` resolves to (through
/// the real configuration code), probing straight to the server.
fn https_spec(certs: &LabCerts, extra: &str) -> CheckSpec {
    let text = format!(
        "[daemon]\ninterface = \"lo\"\n[health_check]\nkind = \"https\"\nca_file = \"{}\"\n\
         {extra}\n[[vip]]\nname = \"web\"\naddress = \"10.100.0.80\"\nport = 443\n\
         [[vip.backend]]\naddress = \"10.0.0.1\"\n",
        certs.path("ca.pem").display()
    );
    let cfg = lb_user::config::Config::from_str(&text, "bench.toml").expect("valid bench config");
    CheckSpec {
        via: Via::Direct,
        ..cfg.vips[0].backends[0].health.clone()
    }
}

/// The detection rows: a hung s_server at the default and fast profiles.
pub(super) async fn https_detection(quick: bool) -> Result<Vec<Row>> {
    let certs = LabCerts::make("https-hang");
    let servers = Servers::start(&certs)?;
    println!();
    println!(
        "figure https, detection: 3 openssl s_server -www on {:?}, kind = \"https\" verified \
         with the lab CA; the third SIGSTOPped at a random phase of the interval",
        servers.addrs
    );
    let mut rows = Vec::new();
    for (name, extra, reps) in [
        ("default", "", if quick { 2 } else { 5 }),
        (
            "fast",
            "interval = \"200ms\"\nfall = 2\ntimeout = \"100ms\"",
            if quick { 4 } else { 20 },
        ),
    ] {
        let spec = https_spec(&certs, extra);
        rows.push(detection(&servers, "s_server (https)", name, &spec, reps).await?);
    }
    Ok(rows)
}
