//! A request's deadline travels with it: the CNI plugin sends the moment its own caller (the
//! container runtime) gives up as `Sdn-Deadline` (milliseconds since the Unix epoch; plugin
//! and agent share the node's clock), and the agent never starts work whose caller has already
//! given up, nor works past that moment — an ADD that outlives its plugin would leave a pod the
//! runtime believes failed. The handler turns the header into the request's deadline
//! ([`effective`]) and hands it to the work as a parameter.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use tokio::time::Instant;

/// The header the plugin sends.
pub const HEADER: &str = sdn_node_cni::agent::DEADLINE_HEADER;

/// The deadline for work started now that may take up to `limit` (the agent's own request
/// timeout): the earlier of that and the caller's deadline, if the request brought one.
pub fn effective(caller: Option<Instant>, limit: Duration) -> Instant {
    let own = Instant::now() + limit;
    caller.map_or(own, |c| c.min(own))
}

/// The caller's deadline from the request's headers: `Ok(None)` without one, `Err` naming the
/// problem for a malformed one. A deadline already past comes back as now (the caller then
/// refuses to start).
pub fn from_headers(headers: &HeaderMap) -> Result<Option<Instant>, String> {
    let Some(v) = headers.get(HEADER) else { return Ok(None) };
    let ms: u64 = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("header {HEADER}: {v:?} is not a number of milliseconds since the Unix epoch"))?;
    Ok(Some(at(UNIX_EPOCH + Duration::from_millis(ms), SystemTime::now(), Instant::now())))
}

/// The monotonic instant of wall-clock time `wall`, given that `now_wall` is `now`.
fn at(wall: SystemTime, now_wall: SystemTime, now: Instant) -> Instant {
    match wall.duration_since(now_wall) {
        // Bounded: a deadline years ahead is no deadline (and must not overflow).
        Ok(ahead) => now + ahead.min(Duration::from_secs(24 * 3600)),
        Err(_) => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_deadlines_map_to_instants() {
        let (w, n) = (SystemTime::now(), Instant::now());
        assert_eq!(at(w + Duration::from_secs(3), w, n), n + Duration::from_secs(3));
        assert_eq!(at(w - Duration::from_secs(3), w, n), n, "passed: now");
        assert_eq!(at(w + Duration::from_secs(1 << 40), w, n), n + Duration::from_secs(24 * 3600));
    }

    #[test]
    fn malformed_headers_are_named() {
        let mut h = HeaderMap::new();
        assert_eq!(from_headers(&h), Ok(None));
        h.insert(HEADER, "soon".parse().unwrap());
        assert!(from_headers(&h).unwrap_err().contains("sdn-deadline"));
        h.insert(HEADER, sdn_node_cni::agent::deadline_value(Duration::from_secs(5)).parse().unwrap());
        let d = from_headers(&h).unwrap().unwrap();
        assert!(d > Instant::now() + Duration::from_secs(3) && d <= Instant::now() + Duration::from_secs(6), "{d:?}");
    }

    #[test]
    fn the_earlier_deadline_wins() {
        let soon = Instant::now() + Duration::from_millis(100);
        assert_eq!(effective(Some(soon), Duration::from_secs(30)), soon);
        assert!(effective(Some(Instant::now() + Duration::from_secs(3600)), Duration::from_secs(1)) <= Instant::now() + Duration::from_secs(1));
        assert!(effective(None, Duration::from_secs(1)) <= Instant::now() + Duration::from_secs(1), "none: the agent's own");
    }
}
