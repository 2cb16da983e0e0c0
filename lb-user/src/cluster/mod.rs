//! Several xlb nodes behind one ECMP group: what each node's tables are
//! built from ([`fingerprint`]), and how `xlb peers` compares the nodes.

pub mod fingerprint;
pub mod peers;
