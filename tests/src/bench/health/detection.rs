//! Figure 1: when a hung application leaves the table. The profiles under
//! test, the bounds each is judged against, and the figure's rows; one
//! repetition is [`hang::detect_once`](super::hang::detect_once).

use std::time::Duration;

use anyhow::{Context as _, Result};
use lb_user::health::{
    policy::Placement,
    probe::{Compact, FailReason},
    spec::{CheckKind, CheckSpec, HttpCheck, Via, defaults},
};

use super::{
    hang::detect_once,
    report::{Row, Secs, Summary, Verdict},
};

/// Margin on the detection targets for scheduling and report delivery.
const DETECTION_MARGIN: Duration = Duration::from_millis(50);

/// Backends of the detection figure's VIP: one hangs, its peers keep
/// answering (what makes the hung one an outlier rather than a slow fleet).
pub(super) const VIP_BACKENDS: usize = 3;

/// The one that hangs.
pub(super) const HUNG: usize = VIP_BACKENDS - 1;

/// Issue 7's target for the fast profile: a hung backend still leaves the
/// table within fall × interval + timeout = 0.5 s, as before probes
/// waited for late answers.
const FAST_TARGET: Duration = Duration::from_millis(500);

/// A health-check configuration under test.
pub(super) struct Profile {
    pub(super) name: &'static str,
    /// `port` is filled in per backend.
    pub(super) spec: CheckSpec,
    pub(super) reps: usize,
    /// Why these settings, printed with them.
    pub(super) note: &'static str,
    /// The time out of the table judged against, when the issue sets one;
    /// else the scheduler's worst case ([`Bounds::out_jittered`]).
    pub(super) target: Option<(Duration, &'static str)>,
}

/// `GET /health`, 2xx, everything else from `health::spec::defaults` except
/// what `f` changes: the spec `config` builds from a TOML that sets only those
/// fields.
pub(super) fn http_spec(f: impl FnOnce(&mut CheckSpec)) -> CheckSpec {
    let mut spec = CheckSpec {
        kind: CheckKind::Http(HttpCheck {
            method: defaults::HTTP_METHOD.to_owned(),
            path: defaults::HTTP_PATH.to_owned(),
            host: None,
            expect_status: vec![defaults::EXPECT_STATUS],
            body_contains: None,
            reuse_connection: None,
        }),
        port: 0,
        interval: defaults::INTERVAL,
        timeout: defaults::TIMEOUT,
        hang_timeout: lb_user::health::spec::default_hang_timeout(defaults::TIMEOUT),
        rise: defaults::RISE,
        fall: defaults::FALL,
        fast_interval: defaults::FAST_INTERVAL,
        down_interval: defaults::DOWN_INTERVAL,
        jitter: defaults::JITTER,
        via: lb_user::health::spec::Via::Direct,
        auto_timeout: false,
        agent: None,
    };
    f(&mut spec);
    spec
}

/// The health check an operator gets from `[health_check]` settings `extra`,
/// resolved by the real configuration code (so derived defaults such as
/// `fast_interval` ≤ `interval` apply exactly as in production). Probes go
/// straight to the backend (`via = "direct"`): there is no data path on
/// loopback, and the detection logic is the same either way.
fn spec_from_config(extra: &str) -> CheckSpec {
    let text = format!(
        "[daemon]\ninterface = \"lo\"\n[health_check]\n{extra}\n\
         [[vip]]\nname = \"bench\"\naddress = \"10.100.0.1\"\nport = 80\n\
         [[vip.backend]]\naddress = \"10.0.0.1\"\n"
    );
    let cfg =
        lb_user::config::Config::from_str(&text, "bench.toml").expect("bench config is valid");
    CheckSpec {
        via: Via::Direct,
        ..cfg.vips[0].backends[0].health.clone()
    }
}

pub(super) fn detection_profiles(quick: bool) -> Vec<Profile> {
    vec![
        Profile {
            name: "default",
            spec: spec_from_config(""),
            reps: if quick { 2 } else { 5 },
            note: "health::spec::defaults, as a configuration without [health_check] gets them",
            target: None,
        },
        Profile {
            name: "default-reuse",
            spec: spec_from_config("reuse_connection = true"),
            reps: if quick { 2 } else { 5 },
            note: "the defaults with reuse_connection = true (reopen_every 10): the hung \
                   backend's kept connection stalls with its event loop",
            target: None,
        },
        Profile {
            name: "fast",
            spec: spec_from_config("interval = \"200ms\"\nfall = 2\ntimeout = \"100ms\""),
            reps: if quick { 5 } else { 20 },
            note: "interval = \"200ms\", fall = 2, timeout = \"100ms\" (a 1s timeout would \
                   dominate a 200ms interval); everything else resolved by the configuration \
                   (hang_timeout 3 × timeout)",
            target: Some((FAST_TARGET, "issue 7")),
        },
        Profile {
            name: "fast-strict",
            spec: spec_from_config(
                "interval = \"200ms\"\nfall = 2\ntimeout = \"100ms\"\nhang_timeout = \"100ms\"",
            ),
            reps: if quick { 5 } else { 20 },
            note: "the fast profile with hang_timeout = timeout: a late answer is a failure, \
                   as before hang_timeout existed",
            target: None,
        },
    ]
}

/// The bounds a detection is judged against.
pub(super) struct Bounds {
    /// Hard down: fall × interval + hang_timeout + margin.
    pub(super) nominal: Duration,
    /// Hard down: fall × interval × (1 + jitter) + hang_timeout + margin:
    /// the judged target.
    pub(super) jittered: Duration,
    /// Hard down, this scheduler's own worst case: the first failing probe
    /// starts at most interval × (1 + jitter) after the last passing one;
    /// each further one at most p = max(interval, fast_interval) × (1 +
    /// jitter) after the previous one started (periods run from the start
    /// of a probe; a late probe lingers without holding up the next), or
    /// timeout + p/10 when the period is shorter than the timeout; the last
    /// one's verdict comes hang_timeout after it started. Plus the margin.
    pub(super) schedule: Duration,
    /// Out of the table: fall × interval + timeout. Among answering peers a
    /// hung backend is a slow outlier once `fall` probes are late, and a
    /// probe is late `timeout` after it starts (issue 7's bound; with
    /// hang_timeout = timeout the hard down comes at the same time).
    pub(super) out_nominal: Duration,
    /// Out of the table, this scheduler's worst case: fall × interval ×
    /// (1 + jitter) + timeout + margin (while probes are only late the
    /// period stays `interval`; a hard failure on the way only shortens it
    /// to fast_interval).
    pub(super) out_jittered: Duration,
}

impl Bounds {
    pub(super) fn of(spec: &CheckSpec) -> Self {
        let stretch = 1.0 + spec.jitter.clamp(0.0, 1.0);
        let fall = spec.fall.max(1);
        let period = spec.interval.max(spec.fast_interval).mul_f64(stretch);
        let gap = period.max(spec.timeout + period / 10);
        Self {
            nominal: spec.interval * fall + spec.hang_timeout + DETECTION_MARGIN,
            jittered: spec.interval.mul_f64(stretch) * fall + spec.hang_timeout + DETECTION_MARGIN,
            schedule: spec.interval.mul_f64(stretch)
                + gap * (fall - 1)
                + spec.hang_timeout
                + DETECTION_MARGIN,
            out_nominal: spec.interval * fall + spec.timeout,
            out_jittered: spec.interval.mul_f64(stretch) * fall + spec.timeout + DETECTION_MARGIN,
        }
    }
}

/// One hang, seen by the VIP policy and by the hard state machine.
pub(super) struct Detection {
    /// From the hang to the policy's first placement of the hung backend
    /// out of the table.
    pub(super) out: Duration,
    /// The placement it left with, and why.
    pub(super) out_as: Placement,
    pub(super) out_reason: String,
    /// From the hang to its hard Up→Down report.
    pub(super) down: Duration,
    pub(super) down_reason: String,
    /// Late interim reports and failed probes of the hung backend until it
    /// left the table.
    pub(super) late: u32,
    pub(super) failures: u32,
}

pub(super) async fn detection(profile: &Profile) -> Result<Vec<Row>> {
    let spec = &profile.spec;
    let bounds = Bounds::of(spec);
    print_method(profile, &bounds);
    let mut tally = Tally::default();
    for rep in 0..profile.reps {
        let d = detect_once(spec, rep)
            .await
            .with_context(|| format!("profile {:?}, repetition {}", profile.name, rep + 1))?;
        println!(
            "  rep {:>2}/{}: out {:>10} as {} ({} late, {} failed probes: {:?}); down {:>10}",
            rep + 1,
            profile.reps,
            Secs(d.out).to_string(),
            d.out_as,
            d.late,
            d.failures,
            d.out_reason,
            Secs(d.down).to_string(),
        );
        tally.add(d);
    }
    tally.rows(profile, &bounds)
}

/// The figure's settings, method and bounds, printed before its repetitions.
fn print_method(profile: &Profile, bounds: &Bounds) {
    let spec = &profile.spec;
    println!();
    println!(
        "figure 1, a hung backend among {} leaving the table, profile {:?} ({})",
        VIP_BACKENDS, profile.name, profile.note
    );
    println!(
        "  check:   GET /health, interval {}, timeout {}, hang_timeout {}, rise {}, fall {}, \
         fast_interval {}, down_interval {}, jitter ±{:.0}%",
        Compact(spec.interval),
        Compact(spec.timeout),
        Compact(spec.hang_timeout),
        spec.rise,
        spec.fall,
        Compact(spec.fast_interval),
        Compact(spec.down_interval),
        spec.jitter * 100.0
    );
    println!(
        "  method:  a VIP of {VIP_BACKENDS} xlb_lab::backend servers on 127.0.0.1, probed by \
         health::scheduler::Scheduler, every report fed to health::policy::evaluate \
         (protection defaults) as the daemon does; once all serve, b{} gets Fault::Hang at T0, \
         a uniform [0, interval) later; out = first placement of b{} out of the table − T0, \
         down = its Up→Down report − T0; {} repetitions",
        HUNG + 1,
        HUNG + 1,
        profile.reps
    );
    println!(
        "  bounds:  out: nominal fall×interval+timeout = {}, worst case \
         fall×interval×{:.2}+timeout+{} = {}; down: nominal fall×interval+hang_timeout+{} = {}, \
         jitter-adjusted {} (judged), schedule {}",
        Secs(bounds.out_nominal),
        1.0 + spec.jitter,
        Compact(DETECTION_MARGIN),
        Secs(bounds.out_jittered),
        Compact(DETECTION_MARGIN),
        Secs(bounds.nominal),
        Secs(bounds.jittered),
        Secs(bounds.schedule),
    );
}

/// What a profile's repetitions measured, in the order they came.
#[derive(Default)]
struct Tally {
    outs: Vec<Duration>,
    downs: Vec<Duration>,
    /// Each placement the hung backend left the table as, and how often.
    left_as: Vec<(Placement, usize)>,
    /// The distinct reasons of its hard down.
    reasons: Vec<String>,
}

impl Tally {
    fn add(&mut self, d: Detection) {
        self.outs.push(d.out);
        self.downs.push(d.down);
        match self.left_as.iter_mut().find(|(p, _)| *p == d.out_as) {
            Some((_, n)) => *n += 1,
            None => self.left_as.push((d.out_as, 1)),
        }
        if !self.reasons.contains(&d.down_reason) {
            self.reasons.push(d.down_reason);
        }
    }

    /// The figure's four rows: time out of the table, the placement it left
    /// as, time to hard down, and the hard down's reason.
    fn rows(self, profile: &Profile, bounds: &Bounds) -> Result<Vec<Row>> {
        let spec = &profile.spec;
        let (target, target_source) = profile
            .target
            .unwrap_or((bounds.out_jittered, "scheduler's worst case"));
        let out = Summary::of(self.outs).context("no repetitions")?;
        let down = Summary::of(self.downs).context("no repetitions")?;
        let expected_reason = FailReason::NoResponse {
            timeout: spec.hang_timeout,
        }
        .to_string();
        // With a grace past timeout the policy ejects the outlier before its
        // probes reach hang_timeout; without one the hard down is the exit.
        let expected_exit = if spec.hang_timeout > spec.timeout {
            Placement::EjectedSlow
        } else {
            Placement::Down
        };
        Ok(vec![
            Row {
                figure: format!(
                    "hung backend out of the table, {} (n={})",
                    profile.name, out.n
                ),
                value: out.to_string(),
                target: format!(
                    "max <= {} ({target_source}; nominal {}, worst case {})",
                    Secs(target),
                    Secs(bounds.out_nominal),
                    Secs(bounds.out_jittered)
                ),
                verdict: Verdict::of(out.max <= target),
            },
            Row {
                figure: format!("hung backend left as, {}", profile.name),
                value: self
                    .left_as
                    .iter()
                    .map(|(p, n)| format!("{p} ×{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                target: expected_exit.to_string(),
                verdict: Verdict::of(self.left_as.iter().all(|(p, _)| *p == expected_exit)),
            },
            Row {
                figure: format!("hung backend hard down, {} (n={})", profile.name, down.n),
                value: down.to_string(),
                target: format!(
                    "max <= {} (jitter-adjusted; nominal {}; schedule {})",
                    Secs(bounds.jittered),
                    Secs(bounds.nominal),
                    Secs(bounds.schedule)
                ),
                verdict: Verdict::of(down.max <= bounds.jittered),
            },
            Row {
                figure: format!("hard down reason, {}", profile.name),
                value: self
                    .reasons
                    .iter()
                    .map(|r| format!("{r:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                target: format!("{expected_reason:?}"),
                verdict: Verdict::of(self.reasons == [expected_reason]),
            },
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_of_the_default_profile() {
        let b = Bounds::of(&http_spec(|_| {}));
        // 3 × 2 s + 3 s + 50 ms; 3 × 2.2 s + 3 s + 50 ms;
        // 2.2 s + 2 × max(2.2 s, 1 s + 0.22 s) + 3 s + 50 ms (periods run
        // from the start of a probe; a failing one lasts the 3 s
        // hang_timeout, and until one has failed the period is interval).
        assert_eq!(b.nominal, Duration::from_millis(9_050));
        assert_eq!(b.jittered.as_millis(), 9_650);
        assert_eq!(b.schedule.as_millis(), 9_650);
    }

    #[test]
    fn out_of_table_bounds() {
        // (name, spec, out_nominal ms, out_jittered ms): fall × interval +
        // timeout, and fall × interval × 1.1 + timeout + 50 ms.
        let cases = [
            ("default", http_spec(|_| {}), 7_000, 7_650),
            (
                "fast: issue 7's 0.5 s",
                http_spec(|s| {
                    s.interval = Duration::from_millis(200);
                    s.timeout = Duration::from_millis(100);
                    s.hang_timeout = Duration::from_millis(300);
                    s.fall = 2;
                }),
                500,
                590,
            ),
            ("no jitter", http_spec(|s| s.jitter = 0.0), 7_000, 7_050),
        ];
        for (name, spec, nominal, jittered) in cases {
            let b = Bounds::of(&spec);
            assert_eq!(b.out_nominal.as_millis(), nominal, "{name}");
            assert_eq!(b.out_jittered.as_millis(), jittered, "{name}");
        }
    }

    #[test]
    fn fast_profile_target_is_the_nominal_bound() {
        let profiles = detection_profiles(false);
        let fast = profiles
            .iter()
            .find(|p| p.name == "fast")
            .expect("fast profile");
        assert_eq!(fast.target.map(|(t, _)| t), Some(FAST_TARGET));
        assert_eq!(Bounds::of(&fast.spec).out_nominal, FAST_TARGET);
        assert_eq!(fast.reps, 20);
    }
}
