//! The agent's ADD answer, checked, and the CNI result printed from it.
//!
//! Every field is checked before anything is printed: the runtime hands the result to the
//! kubelet and to chained plugins verbatim, so a bad address from the agent would surface far
//! from its cause. The answer's type is the contract's ([`crate::wire::AddReply`]): its addresses are
//! typed as they are read; what is checked here is what a type cannot say.

use serde_json::{json, Map, Value};

use crate::error::{self, CniError};
use crate::wire::{AddReply, IpConfig};

/// An empty string is no value (the agent's older versions sent absent fields so).
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// Checks the agent's ADD answer for `object` (e.g. `pod ns/name`). `if_name` and `netns`
/// are what the runtime asked for: the answer must use the same interface name, and a
/// missing sandbox is taken to be the requested namespace.
///
/// The answer comes back complete: `hostVeth`, `ifName`, `mac` and `sandbox` set, and `ips`
/// at least one address (an answer from before `ips` has its `ip` and `gateway` moved there),
/// each with its address set; that is what [`format_result`] prints.
pub fn parse_add_reply(body: &[u8], object: &str, if_name: &str, netns: &str) -> Result<AddReply, CniError> {
    let bad = |field: &str, what: String| {
        CniError::new(
            error::AGENT_BAD_REPLY,
            format!("{object}: agent reply field {field}: {what}"),
            "the sdn-node agent answered ADD with 200 but its reply cannot make a CNI result; this is an agent bug",
        )
    };
    let mut r = AddReply::from_slice(body).map_err(|(field, what)| bad(&field, what))?;
    let host_veth = given(&r.host_veth).ok_or_else(|| bad("hostVeth", "missing".into()))?;
    crate::config::check_ifname(host_veth).map_err(|e| bad("hostVeth", e))?;
    let reply_if = given(&r.if_name).unwrap_or(if_name);
    if reply_if != if_name {
        return Err(bad("ifName", format!("{reply_if:?} but the runtime asked for {if_name:?}")));
    }
    r.if_name = Some(if_name.to_owned());
    if r.mac.is_none() {
        return Err(bad("mac", "missing".into()));
    }
    r.sandbox = Some(given(&r.sandbox).unwrap_or(netns).to_owned());
    // An agent before `ips` wrote its one address as `ip` and `gateway`; a newer one writes
    // both, the same.
    if r.ips.is_empty() {
        let address = Some(r.ip.ok_or_else(|| bad("ip", "missing".into()))?);
        check_ip(&IpConfig { address, gateway: r.gateway }).map_err(|(f, m)| bad(f, m))?;
        r.ips = vec![IpConfig { address, gateway: r.gateway }];
    } else {
        for (i, ip) in r.ips.iter().enumerate() {
            check_ip(ip).map_err(|(f, m)| bad(&format!("ips[{i}].{f}"), m))?;
            // One address per family (Kubernetes' podIPs): a second one would be a second pod IP
            // the cluster never hears of.
            let v4 = |c: &IpConfig| c.address.is_some_and(|a| a.addr().is_ipv4());
            if let Some(j) = r.ips[..i].iter().position(|e| v4(e) == v4(ip)) {
                return Err(bad(&format!("ips[{i}].address"), format!("a second address of the family of ips[{j}]")));
            }
        }
        let first = &r.ips[0];
        if r.ip.is_some_and(|ip| Some(ip) != first.address) || r.gateway.is_some_and(|g| Some(g) != first.gateway) {
            return Err(bad("ip", "ip and gateway are not ips[0]'s address and gateway".into()));
        }
    }
    for (i, rt) in r.routes.iter().enumerate() {
        if rt.dst.is_none() {
            return Err(bad(&format!("routes[{i}].dst"), "missing".into()));
        }
    }
    if let Some(m) = r.mtu.filter(|m| !(68..=65535).contains(m)) {
        return Err(bad("mtu", format!("{m} is not from 68 to 65535")));
    }
    Ok(r)
}

/// An address is there, and its gateway (if any) of its family; the error names the field of
/// the entry.
fn check_ip(ip: &IpConfig) -> Result<(), (&'static str, String)> {
    let Some(address) = ip.address else { return Err(("address", "missing".into())) };
    match ip.gateway {
        Some(gw) if gw.is_ipv4() != address.addr().is_ipv4() => {
            Err(("gateway", format!("{gw} is not of the same family as address {address}")))
        }
        _ => Ok(()),
    }
}

/// The CNI result for `cni_version` from a checked answer ([`parse_add_reply`]): interfaces
/// `[host veth, pod interface]`, the pod's addresses on interface index 1, and the routes.
/// 0.3.x and 0.4.0 add `"version"` to each IP; 1.0.0 dropped it. `dns` is left out (the agent
/// configures none; kubelet writes resolv.conf itself). The MTU is checked but not printed:
/// interface MTUs only entered the result in CNI 1.1.0.
pub fn format_result(r: &AddReply, cni_version: &str) -> Value {
    let legacy = cni_version.starts_with("0.");
    let ips: Vec<Value> = r
        .ips
        .iter()
        .filter_map(|c| {
            let address = c.address?;
            let mut ip = Map::new();
            if legacy {
                ip.insert("version".into(), json!(if address.addr().is_ipv4() { "4" } else { "6" }));
            }
            ip.insert("interface".into(), json!(1));
            ip.insert("address".into(), json!(address.to_string()));
            if let Some(gw) = c.gateway {
                ip.insert("gateway".into(), json!(gw.to_string()));
            }
            Some(Value::Object(ip))
        })
        .collect();
    let routes: Vec<Value> = r
        .routes
        .iter()
        .filter_map(|rt| match (rt.dst?, rt.gw) {
            (dst, Some(gw)) => Some(json!({"dst": dst.to_string(), "gw": gw.to_string()})),
            (dst, None) => Some(json!({"dst": dst.to_string()})),
        })
        .collect();
    let mut out = Map::new();
    out.insert("cniVersion".into(), json!(cni_version));
    out.insert(
        "interfaces".into(),
        json!([
            {"name": r.host_veth},
            {"name": r.if_name, "mac": r.mac, "sandbox": r.sandbox},
        ]),
    );
    out.insert("ips".into(), Value::Array(ips));
    if !routes.is_empty() {
        out.insert("routes".into(), Value::Array(routes));
    }
    Value::Object(out)
}

/// Checks a CHECK's prevResult against the request: if it lists interfaces, one must be the
/// requested pod interface (a cached result from another network or interface means the
/// runtime's state and ours disagree).
pub fn check_prev_result(prev: &Map<String, Value>, if_name: &str) -> Result<(), CniError> {
    let bad = |what: String| {
        CniError::new(
            error::INVALID_CONFIG,
            format!("network config field prevResult.interfaces: {what}"),
            "prevResult is the runtime's cached result of the ADD; delete and re-add the pod sandbox",
        )
    };
    match prev.get("interfaces") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(ifs)) => {
            let found = ifs.iter().any(|i| {
                i.get("name").and_then(Value::as_str) == Some(if_name)
                    && i.get("sandbox").and_then(Value::as_str).is_some_and(|s| !s.is_empty())
            });
            if found {
                Ok(())
            } else {
                Err(bad(format!("no interface {if_name:?} with a sandbox")))
            }
        }
        Some(_) => {
            Err(CniError::new(error::DECODING_FAILURE, "network config field prevResult.interfaces: not an array", ""))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLY: &str = r#"{"hostVeth":"veth1a2b3c4d","ifName":"eth0","mac":"0A:58:0a:80:00:05","sandbox":"/var/run/netns/x",
        "ip":"10.128.0.5/23","gateway":"10.128.0.1","routes":[{"dst":"0.0.0.0/0","gw":"10.128.0.1"},{"dst":"10.128.0.0/14"},
        {"dst":"224.0.0.0/4"}],"mtu":1450}"#;

    fn reply() -> AddReply {
        parse_add_reply(REPLY.as_bytes(), "pod ns/p", "eth0", "/proc/1/ns/net").unwrap()
    }

    #[test]
    fn result_1_0_0() {
        let got = format_result(&reply(), "1.0.0");
        let want = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "veth1a2b3c4d"},
                {"name": "eth0", "mac": "0a:58:0a:80:00:05", "sandbox": "/var/run/netns/x"}
            ],
            "ips": [{"address": "10.128.0.5/23", "gateway": "10.128.0.1", "interface": 1}],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.128.0.1"},
                {"dst": "10.128.0.0/14"},
                {"dst": "224.0.0.0/4"}
            ]
        });
        assert_eq!(got, want);
    }

    #[test]
    fn result_0_4_0_and_0_3_x_have_ip_version() {
        for v in ["0.4.0", "0.3.1", "0.3.0"] {
            let got = format_result(&reply(), v);
            assert_eq!(got["cniVersion"], v);
            assert_eq!(
                got["ips"],
                json!([{"version": "4", "address": "10.128.0.5/23", "gateway": "10.128.0.1", "interface": 1}])
            );
            assert_eq!(got["interfaces"][1]["sandbox"], "/var/run/netns/x");
        }
    }

    /// An agent before `ips` (and an agent of both families, next).
    #[test]
    fn ips_or_ip() {
        let before = REPLY.replace(r#""ip":"10.128.0.5/23","gateway":"10.128.0.1","#, r#""ip":"10.128.0.5/23","#);
        let r = parse_add_reply(before.as_bytes(), "pod ns/p", "eth0", "/ns").unwrap();
        assert_eq!(format_result(&r, "1.0.0")["ips"], json!([{"address": "10.128.0.5/23", "interface": 1}]));
        let both = REPLY.replace(
            r#""ip":"10.128.0.5/23","#,
            r#""ips":[{"address":"10.128.0.5/23","gateway":"10.128.0.1"},{"address":"fd00::5/64","gateway":"fd00::1"}],"ip":"10.128.0.5/23","#,
        );
        let r = parse_add_reply(both.as_bytes(), "pod ns/p", "eth0", "/ns").unwrap();
        assert_eq!(
            format_result(&r, "0.4.0")["ips"],
            json!([
                {"version": "4", "address": "10.128.0.5/23", "gateway": "10.128.0.1", "interface": 1},
                {"version": "6", "address": "fd00::5/64", "gateway": "fd00::1", "interface": 1}
            ])
        );
    }

    /// A dual-stack answer gives CNI 1.0.0's result with both addresses on the pod's interface
    /// (index 1), each with its gateway, and the routes of both families.
    #[test]
    fn dual_stack_result_1_0_0() {
        let both = r#"{"hostVeth":"veth1a2b3c4d","ifName":"eth0","mac":"0a:58:0a:80:02:05","sandbox":"/var/run/netns/x",
            "ips":[{"address":"10.128.2.5/23","gateway":"10.128.2.1"},{"address":"fd00:10:128:2::5/64","gateway":"fd00:10:128:2::1"}],
            "ip":"10.128.2.5/23","gateway":"10.128.2.1",
            "routes":[{"dst":"0.0.0.0/0","gw":"10.128.2.1"},{"dst":"10.128.0.0/14"},{"dst":"224.0.0.0/4"},
                      {"dst":"::/0","gw":"fd00:10:128:2::1"},{"dst":"fd00:10:128::/48"},{"dst":"ff00::/8"}],"mtu":1450}"#;
        let r = parse_add_reply(both.as_bytes(), "pod ns/p", "eth0", "/ns").unwrap();
        assert_eq!(
            format_result(&r, "1.0.0"),
            json!({
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "veth1a2b3c4d"},
                    {"name": "eth0", "mac": "0a:58:0a:80:02:05", "sandbox": "/var/run/netns/x"}
                ],
                "ips": [
                    {"address": "10.128.2.5/23", "gateway": "10.128.2.1", "interface": 1},
                    {"address": "fd00:10:128:2::5/64", "gateway": "fd00:10:128:2::1", "interface": 1}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.128.2.1"},
                    {"dst": "10.128.0.0/14"},
                    {"dst": "224.0.0.0/4"},
                    {"dst": "::/0", "gw": "fd00:10:128:2::1"},
                    {"dst": "fd00:10:128::/48"},
                    {"dst": "ff00::/8"}
                ]
            })
        );
        // Two addresses of one family are refused by field.
        let twice = both.replace("fd00:10:128:2::5/64", "10.128.2.6/23").replace(r#""gateway":"fd00:10:128:2::1""#, r#""gateway":"10.128.2.1""#);
        let e = parse_add_reply(twice.as_bytes(), "pod ns/p", "eth0", "/ns").unwrap_err();
        assert!(e.msg.contains("field ips[1].address: a second address of the family of ips[0]"), "{e}");
    }

    #[test]
    fn ipv6_and_defaults() {
        let r = parse_add_reply(
            br#"{"hostVeth":"v1","mac":"0a:58:00:00:00:01","ip":"fd00::5/64"}"#,
            "pod a/b",
            "eth0",
            "/ns",
        )
        .unwrap();
        assert_eq!(r.sandbox.as_deref(), Some("/ns"));
        assert_eq!(r.if_name.as_deref(), Some("eth0"));
        let got = format_result(&r, "0.4.0");
        assert_eq!(got["ips"], json!([{"version": "6", "address": "fd00::5/64", "interface": 1}]));
        assert!(got.get("routes").is_none());
    }

    #[test]
    fn bad_replies_name_the_field() {
        let cases = [
            ("[]", "(body)"),
            ("{", "(body)"),
            (r#"{"mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24"}"#, "hostVeth: missing"),
            (r#"{"hostVeth":"this-name-is-too-long","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24"}"#, "hostVeth"),
            (r#"{"hostVeth":"v","ifName":"net1","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24"}"#, "ifName"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00","ip":"10.0.0.1/24"}"#, "mac"),
            (r#"{"hostVeth":"v","mac":7,"ip":"10.0.0.1/24"}"#, "mac: invalid type"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1"}"#, "field ip"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/33"}"#, "field ip"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24","gateway":"fd00::1"}"#, "gateway"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01"}"#, "ip: missing"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ips":[{"gateway":"10.0.0.1"}]}"#, "ips[0].address: missing"),
            (
                r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ips":[{"address":"10.0.0.1/24"},{"address":"fd00::1/64","gateway":"10.0.0.1"}]}"#,
                "ips[1].gateway",
            ),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ips":[{"address":"10.0.0.1/24"}],"ip":"10.0.0.2/24"}"#, "field ip"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24","routes":{}}"#, "routes"),
            (
                r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24","routes":[{"gw":"1.1.1.1"}]}"#,
                "routes[0].dst",
            ),
            (
                r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24","routes":[{"dst":"0.0.0.0/0","gw":"x"}]}"#,
                "routes[0].gw",
            ),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24","mtu":-1}"#, "mtu"),
            (r#"{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"10.0.0.1/24","mtu":"1450"}"#, "mtu"),
        ];
        for (body, needle) in cases {
            let e = parse_add_reply(body.as_bytes(), "pod ns/p", "eth0", "/ns").unwrap_err();
            assert_eq!(e.code, error::AGENT_BAD_REPLY, "{body}");
            assert!(e.msg.starts_with("pod ns/p: agent reply field "), "{e}");
            assert!(e.msg.contains(needle), "{body}: {e}");
        }
    }

    /// Addresses as the plugin always took them (the host part kept) or refused them.
    #[test]
    fn addresses() {
        let reply = |ip: &str| format!(r#"{{"hostVeth":"v","mac":"0a:58:00:00:00:01","ip":"{ip}"}}"#);
        let r = parse_add_reply(reply("10.1.2.3/8").as_bytes(), "pod a/b", "eth0", "/ns").unwrap();
        assert_eq!(format_result(&r, "1.0.0")["ips"][0]["address"], "10.1.2.3/8");
        for bad in ["/", "1.2.3.4/", "1.2.3.4/+8", "1.2.3.4/-1", "::1/129", "x/1", "1.2.3.4"] {
            let e = parse_add_reply(reply(bad).as_bytes(), "pod a/b", "eth0", "/ns").unwrap_err();
            assert!(e.msg.contains("field ip: ") && e.msg.contains("is not ADDRESS/PREFIX"), "{bad}: {e}");
        }
    }

    #[test]
    fn prev_result() {
        let ok = json!({"interfaces":[{"name":"veth"},{"name":"eth0","sandbox":"/ns"}]});
        assert!(check_prev_result(ok.as_object().unwrap(), "eth0").is_ok());
        assert!(check_prev_result(&Map::new(), "eth0").is_ok());
        let e = check_prev_result(ok.as_object().unwrap(), "net1").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("prevResult.interfaces"), "{e}");
        let e = check_prev_result(json!({"interfaces": 3}).as_object().unwrap(), "eth0").unwrap_err();
        assert_eq!(e.code, 6);
    }
}
