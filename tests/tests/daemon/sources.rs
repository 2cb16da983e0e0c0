//! Heavy hitters: the cost of walking a full per-source map.

use std::time::{Duration, Instant};

use lb_common::{MAX_SOURCES, SourceState};
use lb_user::dataplane::{LoadOptions, source_key};

/// Walking all `MAX_SOURCES` entries (the daemon does it every second).
#[test]
fn walking_a_full_sources_map() {
    let opts = LoadOptions {
        ct_size: 4096,
        ring_stride: 251,
        pin_dir: None,
    };
    let took = xlb_tests::harness::in_world("srcw", opts, |w| {
        for i in 0..MAX_SOURCES {
            let addr = std::net::Ipv4Addr::from(0x0a00_0000 | i);
            let key = source_key(1, addr.into(), 32, 64);
            let s = SourceState {
                new_flows: u64::from(i),
                ..SourceState::default()
            };
            w.dp.set_source(&key, &s)?;
        }
        let mut took = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let walk = w.dp.sources();
            took.push(t.elapsed());
            assert_eq!(walk.len(), MAX_SOURCES as usize);
        }
        Ok(took)
    })
    .unwrap();
    println!("walking {MAX_SOURCES} sources: {took:?}");
    assert!(took.iter().min().unwrap() < &Duration::from_secs(1));
}
