//! `xlb trace`'s maps and a restart: the pins of an xlb from before tracing
//! (no `XLB_TRACE_CFG`, no `XLB_TRACE`, no flag) are adopted, the maps created
//! beside them, and every flow kept.

use lb_common::{
    CtEntry, FlowKey, PROTO_TCP, addr16,
    trace::{MAP_TRACE_CONFIG, MAP_TRACE_EVENTS, PIN_TRACE_ON},
};
use xlb_tests::{harness::ktime_coarse_ns, lab::serial};

use crate::{backend_id, step, up, vip_key};

#[test]
fn restart_over_pins_without_the_trace_maps_creates_them_and_keeps_flows() {
    let _serial = serial();
    let mut e = up();
    let flow = FlowKey {
        src: addr16("192.0.2.99".parse().unwrap()),
        dst: addr16("10.100.0.1".parse().unwrap()),
        sport: 40_123u16.to_be(),
        dport: 80u16.to_be(),
        proto: PROTO_TCP,
        family: lb_common::FAMILY_V4,
        _pad: [0; 2],
    };
    let id = backend_id(&e, "api", "10.0.0.11:80");
    step("a flow in conntrack, then kill -9", || {
        let mut dp = e.maps().unwrap();
        let generation = dp.backend(id).unwrap().generation;
        let vip_id = dp.vip(&vip_key("10.100.0.1")).unwrap().unwrap().vip_id;
        dp.ct_insert(
            &flow,
            &CtEntry {
                backend_id: id,
                generation,
                vip_id,
                last_seen_ns: ktime_coarse_ns(),
                ..CtEntry::default()
            },
        )
        .unwrap();
        drop(dp);
        e.kill9().unwrap();
    });
    step("the trace pins removed, as an older xlb left them", || {
        for name in [MAP_TRACE_CONFIG, MAP_TRACE_EVENTS, PIN_TRACE_ON] {
            std::fs::remove_file(e.pins().join(name)).unwrap();
        }
    });
    step(
        "start again: adopted, trace maps pinned, the flow kept",
        || {
            std::fs::remove_file(&e.socket).ok();
            e.start().unwrap();
            assert_eq!(e.status().unwrap()["adopted"], true);
            for name in [MAP_TRACE_CONFIG, MAP_TRACE_EVENTS, PIN_TRACE_ON] {
                assert!(e.pins().join(name).exists(), "{name} pinned again");
            }
            let dp = e.maps().unwrap();
            let entry = dp.ct_get(&flow).unwrap().expect("the flow's entry kept");
            assert_eq!(entry.backend_id, id);
            let cfg = dp.trace_config().unwrap();
            assert_eq!(cfg.until_ns, 0, "tracing off in the new map");
        },
    );
}
