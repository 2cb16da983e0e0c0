//! Interface settings the lab checks or changes: TX checksum offload and
//! whether an XDP program is attached.

use std::{
    io,
    process::{Command, Stdio},
};

use super::{Result, ScenarioError, io_err};
use crate::topology::in_netns;

/// `SIOCETHTOOL` commands for the TX checksum offload flag
/// (include/uapi/linux/ethtool.h); `ethtool` itself may not be installed.
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union (the union is 24
/// bytes on 64-bit Linux; the padding keeps the kernel's copy in bounds).
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

fn ethtool_value(sock: &socket2::Socket, ifname: &str, cmd: u32, data: u32) -> io::Result<u32> {
    use std::os::fd::AsRawFd as _;
    let mut value = EthtoolValue { cmd, data };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: &mut value,
        _pad: [0; 16],
    };
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(io::Error::other(format!(
            "interface name {ifname:?} is too long"
        )));
    }
    for (dst, src) in req.name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq whose data pointer points at `value`,
    // both alive for the call; the kernel reads and writes only those.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value.data)
}

/// Turns TX checksum offload of `ifname` in `ns` on or off (`ethtool -K
/// IF tx on|off`) and checks that it took.
pub fn set_tx_checksum_offload(ns: &str, ifname: &str, on: bool) -> Result<()> {
    let what = format!("setting tx checksum offload of {ifname} in {ns} to {on}");
    in_netns(ns, || {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
        ethtool_value(&sock, ifname, ETHTOOL_STXCSUM, u32::from(on))?;
        ethtool_value(&sock, ifname, ETHTOOL_GTXCSUM, 0)
    })?
    .map_err(io_err(what.clone()))
    .and_then(|now| {
        if (now != 0) == on {
            Ok(())
        } else {
            Err(ScenarioError::Invalid(format!(
                "{what}: the kernel kept it at {now}"
            )))
        }
    })
}

/// Whether an XDP program is attached to `ifname` in `ns`.
pub fn xdp_attached(ns: &str, ifname: &str) -> bool {
    Command::new("ip")
        .args(["-n", ns, "-d", "-o", "link", "show", "dev", ifname])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            s.contains("prog/xdp") || s.contains(" xdp ") || s.contains(" xdpgeneric ")
        })
}
