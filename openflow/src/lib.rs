//! OpenFlow 1.3 wire codec with the Nicira (NX) and ONF extensions that Open vSwitch uses.
//!
//! Layers, from the bottom up:
//! - [`wire`]: a bounds-checked reader; every decoder in this crate reads through it, so no
//!   decoder indexes a slice directly and none can panic on short or hostile input.
//! - [`field`], [`flow_match`], [`action`], [`instruction`]: typed OXM/NXM matches, actions and
//!   instructions, each with `decode`/`encoded_len`/`encode`.
//! - [`msg`]: one typed representation per message ([`OfMessage`] wraps a [`Message`] with the
//!   header's version and xid).
//! - [`codec`]: the only I/O-facing piece, a `tokio_util` codec that frames messages on a stream.
//! - [`text`]: the `ovs-ofctl dump-flows` text form, via `Display`.
//!
//! No-panic rule: decoding functions return [`DecodeError`] for every malformed input; they never
//! index out of bounds, never overflow, never allocate more than the input length implies.
//! Everything this crate does not model (message types, OXM fields, actions, instructions,
//! multipart bodies) is kept as raw bytes in an `Unknown`/`Other` variant and re-encoded verbatim.

pub mod accept;
pub mod action;
pub mod codec;
pub mod controller;
pub mod error;
pub mod field;
pub mod flow_match;
pub mod instruction;
pub mod msg;
pub mod port;
pub mod text;
pub mod wire;

pub use action::{Action, Conjunction, Ct, CtZone, Note, RegMove, SetField, Subfield};
pub use controller::Controller;
pub use codec::{BadMessage, OfCodec};
pub use error::{DecodeError, EncodeError, FrameError};
pub use field::NxmField;
pub use flow_match::{ArpMatch, EthMatch, Icmpv6Match, Ip6Proto, IpFrag, IpProto, Ipv4Match, Ipv6Match, MacAddr, Masked, Match, RawOxm};
pub use instruction::Instruction;
pub use msg::*;
pub use port::PortNo;

/// The only OpenFlow version this crate speaks (OpenFlow 1.3).
pub const OFP_VERSION: u8 = 0x04;
/// Nicira's experimenter (vendor) id.
pub const NX_VENDOR_ID: u32 = 0x0000_2320;
/// ONF's experimenter id, used for bundles on OpenFlow 1.3 (ASCII "ONF\0").
pub const ONF_VENDOR_ID: u32 = 0x4f4e_4600;
