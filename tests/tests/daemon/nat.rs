//! NAT mode's daemon side: a `mode = "nat"` VIP's pool reaches the maps
//! (pool, reply filter, pool-address mark) and `status`; `check-config`
//! and reload refuse a pool address the host does not hold (the running
//! pool stays); a reload that changes the ports rewrites the pool; the
//! sweep deletes an expired NAT flow, reply key first.

use std::net::IpAddr;
use std::time::Duration;

use aya::maps::{HashMap as BpfHash, Map, MapData};
use lb_common::nat::{MAP_NAT_FLOWS, MAP_NAT_REPLY, NAT_TCP_CLOSED, NatFlow, NatPool, reply_key};
use lb_common::{FlowKey, PROTO_TCP, VipKey, addr16};

use crate::env::{BACKENDS, Env, config_text, wait_for};
use crate::{serial, step};

/// The NAT VIP: 10.100.0.3:8080 to the backends' port 80, leaving from
/// 10.0.0.1 (xd0's address) with `ports`.
fn nat_vip(snat: &str, ports: &str) -> String {
    let mut s = format!(
        "\n[[vip]]\nname = \"app\"\naddress = \"10.100.0.3\"\nport = 8080\nmode = \"nat\"\n\
         snat = [\"{snat}\"]\nsnat_ports = \"{ports}\"\ntable_size = 251\n"
    );
    for b in BACKENDS {
        s += &format!("[[vip.backend]]\naddress = \"{b}\"\nport = 80\n");
    }
    s
}

fn write_config(e: &Env, snat: &str, ports: &str) {
    let text = config_text(e, 1, 251) + &nat_vip(snat, ports);
    std::fs::write(&e.config, text).unwrap();
}

fn app_pool(e: &Env) -> NatPool {
    let dp = e.maps().unwrap();
    let key = VipKey::new("10.100.0.3".parse().unwrap(), 8080, PROTO_TCP);
    let id = dp.vip(&key).unwrap().expect("vip app in the maps").vip_id;
    dp.nat_pool(id).unwrap()
}

#[test]
fn a_nat_vip_reaches_the_maps_and_status_and_its_flows_are_swept() {
    let _serial = serial();
    let mut e = Env::new().unwrap();
    step(
        "check-config refuses a pool address no interface holds",
        || {
            write_config(&e, "10.0.0.99", "10000-32767");
            let out = e
                .in_ns()
                .arg(crate::env::xlb_bin())
                .args(["check-config", "--config"])
                .arg(&e.config)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success());
            assert!(
                err.contains(
                    "vip \"app\": snat 10.0.0.99 is not an address of any interface on this host"
                ),
                "{err}"
            );
        },
    );
    step(
        "start: the pool, the reply filter and the mark are written",
        || {
            write_config(&e, "10.0.0.1", "10000-32767");
            e.start().unwrap();
            wait_for(Duration::from_secs(10), "app's backends up", || {
                Ok(BACKENDS.iter().all(|b| {
                    e.backend_state("app", &format!("{b}:80")).ok().as_deref() == Some("up")
                }))
            })
            .unwrap();
            let pool = app_pool(&e);
            assert_eq!(pool.count, 1);
            assert_eq!((pool.port_min, pool.port_max), (10_000, 32_767));
            assert_eq!(pool.addrs[0], addr16("10.0.0.1".parse().unwrap()));
            assert_eq!(pool.tcp_established_timeout_ns, 7200 * 1_000_000_000);
            let dp = e.maps().unwrap();
            let bits = dp
                .vip_addr_bits("10.0.0.1".parse().unwrap())
                .unwrap()
                .expect("the pool address is marked");
            assert_ne!(bits & lb_user::dataplane::nat::VIP_ADDR_NAT_POOL, 0);
        },
    );
    step("status shows the mode, the pool and the NAT maps", || {
        wait_for(Duration::from_secs(5), "a NAT walk", || {
            Ok(e.status()?["nat"]["entries"].is_u64())
        })
        .unwrap();
        let s = e.status().unwrap();
        let app = s["vips"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "app")
            .unwrap()
            .clone();
        assert_eq!(app["mode"], "nat");
        assert_eq!(app["nat"]["snat"], serde_json::json!(["10.0.0.1"]));
        assert_eq!(app["nat"]["snat_ports"], "10000-32767");
        assert_eq!(app["nat"]["flows"], 0);
        assert_eq!(s["nat"]["capacity"], 262_144);
        let text = e.xlb(&["status"]).unwrap();
        assert!(
            text.contains("  nat: snat 10.0.0.1 ports 10000-32767 (22768 per backend port)"),
            "{text}"
        );
    });
    step(
        "reload: a pool address not on the host is refused, the pool kept",
        || {
            let before = app_pool(&e);
            write_config(&e, "10.0.0.99", "20000-20999");
            let err = e.xlb(&["reload"]).unwrap_err().to_string();
            assert!(err.contains("snat 10.0.0.99 is not an address"), "{err}");
            assert_eq!(app_pool(&e), before);
        },
    );
    step("reload: new ports rewrite the pool", || {
        write_config(&e, "10.0.0.1", "20000-20999");
        e.xlb(&["reload"]).unwrap();
        let pool = app_pool(&e);
        assert_eq!((pool.port_min, pool.port_max), (20_000, 20_999));
    });
    step(
        "reload: a NAT VIP removed, then added again, goes live with its pool",
        || {
            std::fs::write(&e.config, config_text(&e, 1, 251)).unwrap();
            e.xlb(&["reload"]).unwrap();
            let dp = e.maps().unwrap();
            let key = VipKey::new("10.100.0.3".parse().unwrap(), 8080, PROTO_TCP);
            assert!(dp.vip(&key).unwrap().is_none(), "app removed");
            assert!(
                dp.vip_addr_bits("10.0.0.1".parse().unwrap())
                    .unwrap()
                    .is_none(),
                "its pool address unmarked"
            );
            // The daemon (a debug build) asserts that the pool is in the
            // maps before the VIP's entry: added in the other order, the
            // reload fails.
            write_config(&e, "10.0.0.1", "20000-20999");
            e.xlb(&["reload"]).unwrap();
            let pool = app_pool(&e);
            assert_eq!((pool.count, pool.port_min), (1, 20_000));
        },
    );
    step(
        "the sweep deletes an expired flow and its reply key",
        || {
            sweep_one(&e);
        },
    );
    e.stop().unwrap();
}

/// Writes a NAT flow of VIP app closed long ago (and its reply key) into
/// the pinned maps; the sweep deletes both within a few seconds and
/// counts it.
fn sweep_one(e: &Env) {
    let dp = e.maps().unwrap();
    let key = VipKey::new("10.100.0.3".parse().unwrap(), 8080, PROTO_TCP);
    let vip_id = dp.vip(&key).unwrap().unwrap().vip_id;
    let backend: IpAddr = BACKENDS[0].parse().unwrap();
    let id = crate::backend_id(e, "app", &format!("{backend}:80"));
    let info = dp.backend(id).unwrap();
    let client = FlowKey::new(
        "192.0.2.7:40000".parse().unwrap(),
        "10.100.0.3:8080".parse().unwrap(),
        PROTO_TCP,
    );
    let flow = NatFlow {
        backend_id: id,
        generation: info.generation,
        vip_id,
        state: NAT_TCP_CLOSED,
        nat_addr: addr16("10.0.0.1".parse().unwrap()),
        nat_port: 20_001u16.to_be(),
        backend_port: 80u16.to_be(),
        last_seen_ns: 1,
        ..NatFlow::default()
    };
    let reply = reply_key(&client, &flow, &info.addr);
    let data = |name: &str| Map::HashMap(MapData::from_pin(e.pins().join(name)).unwrap());
    let mut flows: BpfHash<MapData, FlowKey, NatFlow> = data(MAP_NAT_FLOWS).try_into().unwrap();
    let mut replies: BpfHash<MapData, FlowKey, FlowKey> = data(MAP_NAT_REPLY).try_into().unwrap();
    replies.insert(reply, client, 0).unwrap();
    flows.insert(client, flow, 0).unwrap();
    wait_for(Duration::from_secs(5), "the sweep", || {
        Ok(flows.get(&client, 0).is_err() && replies.get(&reply, 0).is_err())
    })
    .unwrap();
    wait_for(Duration::from_secs(5), "the sweep counted", || {
        Ok(e.status()?["nat"]["swept"].as_u64().unwrap_or(0) >= 1)
    })
    .unwrap();
}
