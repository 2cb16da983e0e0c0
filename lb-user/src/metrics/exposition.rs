//! The Prometheus text exposition format (version 0.0.4), and the table
//! shape every metric family is declared in: a name, a type, a help text
//! and a function that reads one subject's [`Value`] from a snapshot.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::LatencyHistogram;

/// A metric family's `# TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Gauge,
    Counter,
    Histogram,
}

impl Kind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Gauge => "gauge",
            Self::Counter => "counter",
            Self::Histogram => "histogram",
        }
    }
}

/// One metric family of subjects `T` (the daemon, a VIP, a backend).
pub(super) struct Family<T> {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    pub(super) help: &'static str,
    /// What one subject contributes to the family.
    pub(super) value: for<'a> fn(&'a T) -> Value<'a>,
}

/// What one subject contributes to a family, under the subject's own
/// labels ([`Subject::labels`]).
pub(super) enum Value<'a> {
    /// One sample.
    Int(u64),
    /// One sample that may be fractional.
    Float(f64),
    /// No sample for this subject (yet).
    Absent,
    /// One sample, always 1; these further labels describe the subject.
    Info(Vec<(&'static str, Cow<'a, str>)>),
    /// One sample per value of a further label.
    ByLabel(&'static str, Vec<(Cow<'a, str>, u64)>),
    /// `_bucket` samples per bound and `+Inf`, then `_sum` and `_count`.
    Histogram(&'a LatencyHistogram),
}

impl Value<'_> {
    /// One sample per entry of `all` under `label`: 1 for `current`, 0 for
    /// the others (a state as Prometheus likes enumerations).
    pub(super) fn one_of(label: &'static str, all: &[&'static str], current: &str) -> Self {
        let samples = all
            .iter()
            .map(|&value| (Cow::Borrowed(value), u64::from(value == current)))
            .collect();
        Self::ByLabel(label, samples)
    }
}

/// Something metrics are about, and the labels that say which.
pub(super) trait Subject {
    fn labels(&self) -> Vec<(&'static str, &str)>;
}

/// The exposition text being written.
#[derive(Default)]
pub(super) struct Out {
    text: String,
}

impl Out {
    pub(super) fn into_text(self) -> String {
        self.text
    }

    /// Writes each family of `families` with the samples of every subject.
    pub(super) fn families<'s, T: Subject + 's>(
        &mut self,
        families: &[Family<T>],
        subjects: impl Iterator<Item = &'s T> + Clone,
    ) {
        for family in families {
            self.family(family.name, family.kind, family.help);
            for subject in subjects.clone() {
                self.value(family.name, &subject.labels(), (family.value)(subject));
            }
        }
    }

    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {}", kind.as_str());
    }

    fn value(&mut self, name: &str, labels: &[(&str, &str)], value: Value<'_>) {
        match value {
            Value::Int(n) => self.sample(name, labels, n),
            Value::Float(x) => self.sample_f64(name, labels, x),
            Value::Absent => {}
            Value::Info(info) => {
                let info: Vec<_> = info.iter().map(|(k, v)| (*k, v.as_ref())).collect();
                self.sample(name, &[labels, &info].concat(), 1);
            }
            Value::ByLabel(label, samples) => {
                for (v, n) in &samples {
                    self.sample(name, &[labels, &[(label, v.as_ref())]].concat(), *n);
                }
            }
            Value::Histogram(h) => self.histogram(name, labels, h),
        }
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &LatencyHistogram) {
        let bucket = format!("{name}_bucket");
        for (le, n) in h.cumulative() {
            let le = le.to_string();
            self.sample(&bucket, &[labels, &[("le", &le)]].concat(), n);
        }
        self.sample(&bucket, &[labels, &[("le", "+Inf")]].concat(), h.count());
        self.sample_f64(&format!("{name}_sum"), labels, h.sum_seconds());
        self.sample(&format!("{name}_count"), labels, h.count());
    }

    fn labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.labels(name, labels);
        let _ = writeln!(self.text, " {value}");
    }

    fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.labels(name, labels);
        // Rust's Display of f64 never uses an exponent and prints NaN and
        // inf in a way Prometheus would reject; neither can occur here
        // (sums of durations, a timestamp), but keep the output parseable.
        if value.is_finite() {
            let _ = writeln!(self.text, " {value}");
        } else {
            self.text.push_str(" NaN\n");
        }
    }
}

/// A label value: backslash, double quote and newline escaped.
pub(super) fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A HELP text: backslash and newline escaped.
pub(super) fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}
