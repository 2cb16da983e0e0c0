//! libtest's closing lines, added up: what `cargo xtask test` reports for
//! the host's run and for each kernel of the matrix.

use std::io;

/// Copies `from` to `to` as it arrives (so a slow test shows its name while it
/// runs) and adds up libtest's `test result:` lines.
pub(crate) fn tee_counting(
    mut from: impl io::Read,
    mut to: impl io::Write,
) -> io::Result<TestCounts> {
    let mut counts = TestCounts::default();
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
        for &b in &buf[..n] {
            if b == b'\n' {
                counts.add_line(&String::from_utf8_lossy(&line));
                line.clear();
            } else {
                line.push(b);
            }
        }
    }
    counts.add_line(&String::from_utf8_lossy(&line));
    Ok(counts)
}

/// Totals over every test binary and doc-test run.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TestCounts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
}

impl TestCounts {
    /// Adds another run's totals (a kernel of the matrix).
    pub(crate) fn add(&mut self, other: &Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }

    /// Adds `line` if it is libtest's `test result: ok. 3 passed; 0 failed;
    /// 1 ignored; 0 measured; 0 filtered out; finished in 0.01s`.
    pub(crate) fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else {
                continue;
            };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }

    /// The closing line in the form test reports are read in.
    pub(crate) fn summary(&self) -> String {
        format!(
            "tests: {} passed, {} failed, {} skipped",
            self.passed, self.failed, self.ignored
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_line_cases() {
        let cases = [
            (
                "passing binary",
                "test result: ok. 12 passed; 0 failed; 2 ignored; 0 measured; 3 filtered out; finished in 0.31s",
                TestCounts {
                    passed: 12,
                    failed: 0,
                    ignored: 2,
                },
            ),
            (
                "failing binary",
                "test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s",
                TestCounts {
                    passed: 4,
                    failed: 1,
                    ignored: 0,
                },
            ),
            (
                "test name line",
                "test maglev::tests::spread ... ok",
                TestCounts::default(),
            ),
            ("running line", "running 3 tests", TestCounts::default()),
            ("empty", "", TestCounts::default()),
        ];
        for (name, line, want) in cases {
            let mut counts = TestCounts::default();
            counts.add_line(line);
            assert_eq!(counts, want, "case {name}");
        }
    }

    #[test]
    fn tee_copies_everything_and_sums_binaries() {
        let output = "running 2 tests\ntest a ... ok\ntest b ... ok\n\n\
                      test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
                      running 1 test\n\
                      test result: FAILED. 0 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s";
        let mut copy = Vec::new();
        let counts = tee_counting(output.as_bytes(), &mut copy).unwrap();
        assert_eq!(copy, output.as_bytes(), "output passed through unchanged");
        assert_eq!(
            counts,
            TestCounts {
                passed: 2,
                failed: 1,
                ignored: 1
            }
        );
        assert_eq!(counts.summary(), "tests: 2 passed, 1 failed, 1 skipped");
    }
}
