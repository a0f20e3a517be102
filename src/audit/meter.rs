//! The audit meter and the connection's packet-in settings, on one connection.

use openflow::{ErrorCode, MeterCommand, MeterFeatures, MeterMod, OFPM_CONTROLLER};
use sdn_model::pipeline::audit::{AUDIT_MAX_LEN, AUDIT_METER_ID};

use crate::switch::{Switch, SwitchError};

/// OFPMMFC_METER_EXISTS: an ADD of a meter that is there.
const METER_EXISTS: ErrorCode = ErrorCode::Standard { typ: 12, code: 1 };

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("the datapath has no packets-per-second drop meters ({0:?}); the audit log cannot be rate-limited")]
    MetersUnsupported(MeterFeatures),
    #[error("audit meter {meter:#x}: {source}")]
    Meter { meter: u32, source: SwitchError },
    #[error("asking for packet-ins: {0}")]
    PacketIns(SwitchError),
    #[error("reading meter features: {0}")]
    Features(SwitchError),
}

/// Installs (or updates) the audit meter and OVS's controller meter with the same limit, then
/// asks for packet-ins. The meters are refused outright on a datapath without pktps meters:
/// an unmetered audit log is what this design must never be.
pub async fn install(sw: &Switch, rate_per_sec: u32, burst: u32) -> Result<(), SetupError> {
    let f = sw.meter_features().await.map_err(SetupError::Features)?;
    if !f.supports_pktps_drop() {
        return Err(SetupError::MetersUnsupported(f));
    }
    for meter in [AUDIT_METER_ID, OFPM_CONTROLLER] {
        put_meter(sw, meter, rate_per_sec, burst).await.map_err(|source| SetupError::Meter { meter, source })?;
    }
    sw.enable_packet_ins(AUDIT_MAX_LEN).await.map_err(SetupError::PacketIns)
}

/// ADD, or MODIFY when the meter exists (a reconnect to a switch that kept it, a new rate).
async fn put_meter(sw: &Switch, meter: u32, rate: u32, burst: u32) -> Result<(), SwitchError> {
    match sw.meter_mod(MeterMod::pktps_drop(MeterCommand::Add, meter, rate, burst)).await {
        Err(SwitchError::Rejected(r)) if r.error.code == METER_EXISTS => {
            sw.meter_mod(MeterMod::pktps_drop(MeterCommand::Modify, meter, rate, burst)).await
        }
        other => other,
    }
}
