//! Certificates for the TLS lab tests and benchmarks, made by
//! `tests/tls/make-certs.sh` (the openssl CLI) in a temporary directory
//! that is removed on drop; and `openssl s_server` backends.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory of `make-certs.sh`'s files (`ca.pem`, `good.pem`,
/// `good.key`, `other.pem`...), removed on drop.
pub struct LabCerts {
    dir: PathBuf,
}

impl LabCerts {
    /// Makes them under the system's temporary directory, in a directory
    /// named after `tag` and this process.
    pub fn make(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("xlb-certs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tls/make-certs.sh");
        let certs = Self { dir };
        let status = Command::new("sh")
            .arg(&script)
            .arg(&certs.dir)
            .status()
            .unwrap_or_else(|e| panic!("running {}: {e} (needs openssl)", script.display()));
        assert!(status.success(), "{} failed: {status}", script.display());
        certs
    }

    /// The path of one of the files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `openssl s_server` arguments serving `-www` on `port` with the
    /// certificate `name` (`good`, `other`...).
    pub fn s_server_args(&self, name: &str, port: u16) -> Vec<String> {
        let file = |ext: &str| self.path(&format!("{name}.{ext}")).display().to_string();
        [
            "s_server",
            "-quiet",
            "-www",
            "-accept",
            &port.to_string(),
            "-cert",
            &file("pem"),
            "-key",
            &file("key"),
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

impl Drop for LabCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
