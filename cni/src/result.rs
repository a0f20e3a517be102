//! The agent's ADD answer, checked, and the CNI result printed from it.
//!
//! Every field is checked before anything is printed: the runtime hands the result to the
//! kubelet and to chained plugins verbatim, so a bad address from the agent would surface far
//! from its cause.

use std::net::IpAddr;

use serde_json::{json, Map, Value};

use crate::error::{self, CniError};
use crate::wire;

/// An address with its prefix length (`10.128.0.5/23`): the host address is kept, not masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = s.split_once('/').ok_or_else(|| format!("{s:?} is not ADDRESS/PREFIX"))?;
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?}: {a:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p.parse::<u8>() {
            Ok(n) if n <= max && !p.starts_with('+') => n,
            _ => return Err(format!("{s:?}: prefix {p:?} is not 0 to {max}")),
        };
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: Cidr,
    pub gw: Option<IpAddr>,
}

/// A checked ADD answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddReply {
    pub host_veth: String,
    pub if_name: String,
    pub mac: String,
    pub sandbox: String,
    pub ip: Cidr,
    pub gateway: Option<IpAddr>,
    pub routes: Vec<Route>,
    /// Checked but not printed: interface MTUs only entered the result in CNI 1.1.0.
    pub mtu: Option<u32>,
}

/// The canonical form (six octets of two hex digits: [`netif::MacAddr`]'s), lower-cased.
fn check_mac(s: &str) -> Result<String, String> {
    if s.parse::<netif::MacAddr>().is_ok() {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(format!("{s:?} is not a MAC address (xx:xx:xx:xx:xx:xx)"))
    }
}

/// An empty string is no value (the agent's older versions sent absent fields so).
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// Checks the agent's ADD answer for `object` (e.g. `pod ns/name`). `if_name` and `netns`
/// are what the runtime asked for: the answer must use the same interface name, and a
/// missing sandbox is taken to be the requested namespace.
pub fn parse_add_reply(body: &[u8], object: &str, if_name: &str, netns: &str) -> Result<AddReply, CniError> {
    let bad = |field: &str, what: String| {
        CniError::new(
            error::AGENT_BAD_REPLY,
            format!("{object}: agent reply field {field}: {what}"),
            "the sdn-node agent answered ADD with 200 but its reply cannot make a CNI result; this is an agent bug",
        )
    };
    let r = wire::AddReply::from_slice(body).map_err(|(field, what)| bad(&field, what))?;
    let required = |field: &str, v: &Option<String>| given(v).map(str::to_owned).ok_or_else(|| bad(field, "missing".into()));

    let host_veth = required("hostVeth", &r.host_veth)?;
    crate::config::check_ifname(&host_veth).map_err(|e| bad("hostVeth", e))?;
    let reply_if = given(&r.if_name).unwrap_or(if_name);
    if reply_if != if_name {
        return Err(bad("ifName", format!("{reply_if:?} but the runtime asked for {if_name:?}")));
    }
    let mac = check_mac(&required("mac", &r.mac)?).map_err(|e| bad("mac", e))?;
    let sandbox = given(&r.sandbox).unwrap_or(netns).to_owned();
    let ip = Cidr::parse(&required("ip", &r.ip)?).map_err(|e| bad("ip", e))?;
    let gateway = match given(&r.gateway) {
        None => None,
        Some(g) => {
            let gw: IpAddr = g.parse().map_err(|_| bad("gateway", format!("{g:?} is not an IP address")))?;
            if gw.is_ipv4() != ip.addr.is_ipv4() {
                return Err(bad("gateway", format!("{g:?} is not of the same family as ip {ip}")));
            }
            Some(gw)
        }
    };
    let mut routes = Vec::with_capacity(r.routes.len());
    for (i, rt) in r.routes.iter().enumerate() {
        let d = rt.dst.as_deref().ok_or_else(|| bad(&format!("routes[{i}].dst"), "missing".into()))?;
        let dst = Cidr::parse(d).map_err(|e| bad(&format!("routes[{i}].dst"), e))?;
        let gw = match given(&rt.gw) {
            None => None,
            Some(g) => Some(g.parse::<IpAddr>().map_err(|_| bad(&format!("routes[{i}].gw"), format!("{g:?} is not an IP address")))?),
        };
        routes.push(Route { dst, gw });
    }
    if let Some(m) = r.mtu.filter(|m| !(68..=65535).contains(m)) {
        return Err(bad("mtu", format!("{m} is not from 68 to 65535")));
    }
    Ok(AddReply { host_veth, if_name: if_name.to_owned(), mac, sandbox, ip, gateway, routes, mtu: r.mtu })
}

/// The CNI result for `cni_version`: interfaces `[host veth, pod interface]`, the pod's
/// address on interface index 1, and the routes. 0.3.x and 0.4.0 add `"version"` to each IP;
/// 1.0.0 dropped it. `dns` is left out (the agent configures none; kubelet writes
/// resolv.conf itself).
pub fn format_result(r: &AddReply, cni_version: &str) -> Value {
    let legacy = cni_version.starts_with("0.");
    let mut ip = Map::new();
    if legacy {
        ip.insert("version".into(), json!(if r.ip.addr.is_ipv4() { "4" } else { "6" }));
    }
    ip.insert("interface".into(), json!(1));
    ip.insert("address".into(), json!(r.ip.to_string()));
    if let Some(gw) = r.gateway {
        ip.insert("gateway".into(), json!(gw.to_string()));
    }
    let routes: Vec<Value> = r
        .routes
        .iter()
        .map(|rt| match rt.gw {
            Some(gw) => json!({"dst": rt.dst.to_string(), "gw": gw.to_string()}),
            None => json!({"dst": rt.dst.to_string()}),
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
    out.insert("ips".into(), Value::Array(vec![Value::Object(ip)]));
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

    #[test]
    fn ipv6_and_defaults() {
        let r = parse_add_reply(
            br#"{"hostVeth":"v1","mac":"0a:58:00:00:00:01","ip":"fd00::5/64"}"#,
            "pod a/b",
            "eth0",
            "/ns",
        )
        .unwrap();
        assert_eq!(r.sandbox, "/ns");
        assert_eq!(r.if_name, "eth0");
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

    #[test]
    fn cidr() {
        assert_eq!(Cidr::parse("10.1.2.3/8").unwrap().to_string(), "10.1.2.3/8");
        for bad in ["", "/", "1.2.3.4/", "1.2.3.4/+8", "1.2.3.4/-1", "::1/129", "x/1"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
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
