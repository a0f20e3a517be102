//! Translation of the rule model (`firewall`) into an nf_tables netlink batch with nftnl, and
//! its installation (one atomic batch) in a namespace.
//! Each message's description is kept in batch order so a kernel NACK can name the object.

use std::ffi::CString;

use std::net::Ipv6Addr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use nftnl::{
    expr::{
        Bitwise, Cmp, CmpOp, Conntrack, InterfaceName, Ipv4HeaderField, Ipv6HeaderField, Masquerade, Meta,
        NetworkHeaderField, Payload, States, TransportHeaderField, UdpHeaderField, Verdict,
    },
    Batch, Chain, ChainType, FinalizedBatch, Hook, MsgType, Policy, ProtoFamily, Rule, Table,
};

use crate::{
    error::{Error, Result},
    firewall::{self, Action, ChainId, FirewallConfig, Match, RuleSpec},
    netns::Netns,
    nfnl,
};

/// Installs (or atomically replaces) the rule set in namespace `ns`: the `ip` table for an IPv4
/// cluster network, the `ip6` one for an IPv6 one, in one batch; the same batch removes our
/// table of a family the configuration does not have (left from an earlier one).
pub async fn install_firewall(ns: &Netns, cfg: &FirewallConfig) -> Result<()> {
    cfg.validate()?;
    let cfg = cfg.clone();
    let what = match (&cfg.ipv4, &cfg.ipv6) {
        (Some(_), Some(_)) => format!("install nftables tables ip and ip6 {}", cfg.table),
        (Some(_), None) => format!("install nftables table ip {} (remove ip6)", cfg.table),
        (None, _) => format!("install nftables table ip6 {} (remove ip)", cfg.table),
    };
    ns.run(&what, move || {
        let rules = cfg.ipv4.as_ref().map(|_| firewall::rules(&cfg));
        let rules6 = cfg.ipv6.as_ref().map(|_| firewall::rules6(&cfg));
        let (batch, names) = install_batch(&cfg.table, rules.as_deref(), rules6.as_deref())?;
        nfnl::send_batch(&batch, &names)
    })
    .await
}

/// Removes our tables (`ip` and `ip6`) from namespace `ns`; a missing table is success.
pub async fn remove_firewall(ns: &Netns, table: &str) -> Result<()> {
    firewall::check_table_name(table)?;
    let table = table.to_string();
    ns.run(&format!("remove nftables tables ip and ip6 {table}"), move || {
        let (batch, names) = remove_batch(&table)?;
        nfnl::send_batch(&batch, &names)
    })
    .await
}

/// A finalized batch and one description per object message, in order.
pub(crate) type Described = (FinalizedBatch, Vec<String>);

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what} {s:?}"), "contains NUL"))
}

/// "Create if missing, delete, create" for the `ip` table with `rules` or, without them,
/// "create if missing, delete"; then the same for the `ip6` table with `rules6`: the first add
/// makes the delete valid whether or not the table existed (NEWTABLE on an existing table
/// without NLM_F_EXCL is a no-op).
pub(crate) fn install_batch(
    table_name: &str,
    rules: Option<&[RuleSpec]>,
    rules6: Option<&[RuleSpec]>,
) -> Result<Described> {
    let mut batch = Batch::new();
    let mut names = Vec::new();
    add_table(&mut batch, &mut names, table_name, ProtoFamily::Ipv4, rules)?;
    add_table(&mut batch, &mut names, table_name, ProtoFamily::Ipv6, rules6)?;
    Ok((batch.finalize(), names))
}

fn family_name(family: ProtoFamily) -> &'static str {
    match family {
        ProtoFamily::Ipv6 => "ip6",
        _ => "ip",
    }
}

/// Adds to `batch` the replacement of table `family` `table_name` by one with our chains and
/// `rules`, or (None) its removal.
fn add_table(
    batch: &mut Batch,
    names: &mut Vec<String>,
    table_name: &str,
    family: ProtoFamily,
    rules: Option<&[RuleSpec]>,
) -> Result<()> {
    let table = Table::new(cstring("table", table_name)?, family);
    let tname = format!("table {} {table_name}", family_name(family));
    let steps: &[(MsgType, &str)] = match rules {
        Some(_) => &[(MsgType::Add, "ensure"), (MsgType::Del, "delete"), (MsgType::Add, "add")],
        None => &[(MsgType::Add, "ensure"), (MsgType::Del, "delete")],
    };
    for (op, what) in steps {
        batch.add(&table, *op);
        names.push(format!("{what} {tname}"));
    }
    let Some(rules) = rules else {
        return Ok(());
    };
    let chains: Vec<(ChainId, Chain<'_>)> =
        ChainId::ALL.iter().map(|id| Ok((*id, chain(&table, *id)?))).collect::<Result<_>>()?;
    for (id, c) in &chains {
        batch.add(c, MsgType::Add);
        names.push(format!("add chain {} in {tname}", id.name()));
    }
    for (i, spec) in rules.iter().enumerate() {
        let Some((_, c)) = chains.iter().find(|(id, _)| *id == spec.chain) else {
            return Err(Error::invalid(format!("rule {i}"), "unknown chain"));
        };
        let r = rule(c, spec, family)?;
        batch.add(&r, MsgType::Add);
        names.push(format!("add rule {i} ({}) in chain {} of {tname}", spec.comment, spec.chain.name()));
    }
    Ok(())
}

/// "Create if missing, delete" for both families: removal that succeeds whether or not the
/// tables exist.
pub(crate) fn remove_batch(table_name: &str) -> Result<Described> {
    let mut batch = Batch::new();
    let mut names = Vec::new();
    add_table(&mut batch, &mut names, table_name, ProtoFamily::Ipv4, None)?;
    add_table(&mut batch, &mut names, table_name, ProtoFamily::Ipv6, None)?;
    Ok((batch.finalize(), names))
}

fn chain(table: &Table, id: ChainId) -> Result<Chain<'_>> {
    let mut c = Chain::new(cstring("chain", id.name())?, table);
    let (hook, prio, ty) = match id {
        ChainId::Postrouting => (Hook::PostRouting, 100, ChainType::Nat),
        ChainId::Forward => (Hook::Forward, 0, ChainType::Filter),
        ChainId::Input => (Hook::In, 0, ChainType::Filter),
    };
    c.set_hook(hook, prio);
    c.set_type(ty);
    c.set_policy(Policy::Accept);
    Ok(c)
}

fn rule<'a>(chain: &'a Chain<'_>, spec: &RuleSpec, family: ProtoFamily) -> Result<Rule<'a>> {
    let mut r = Rule::new(chain);
    for m in &spec.matches {
        add_match(&mut r, m, family)?;
    }
    match spec.action {
        Action::Accept => r.add_expr(&Verdict::Accept),
        Action::Drop => r.add_expr(&Verdict::Drop),
        Action::Masquerade => r.add_expr(&Masquerade),
    }
    r.set_comment(cstring("comment", spec.comment)?)
        .map_err(|e| Error::invalid(format!("comment {:?}", spec.comment), e))?;
    Ok(r)
}

fn add_match(r: &mut Rule<'_>, m: &Match, family: ProtoFamily) -> Result<()> {
    match m {
        Match::SaddrIn(net) => prefix(r, Field::Saddr, *net, CmpOp::Eq, family)?,
        Match::DaddrIn(net) => prefix(r, Field::Daddr, *net, CmpOp::Eq, family)?,
        Match::DaddrNotIn(net) => prefix(r, Field::Daddr, *net, CmpOp::Neq, family)?,
        Match::CtStateInvalid => {
            // ct state is a host-endian bit set: (state & INVALID) != 0.
            r.add_expr(&Conntrack::State);
            r.add_expr(&Bitwise::new(States::INVALID.bits(), 0u32));
            r.add_expr(&Cmp::new(CmpOp::Neq, 0u32));
        }
        Match::UdpDport(port) => {
            r.add_expr(&Meta::L4Proto);
            r.add_expr(&Cmp::new(CmpOp::Eq, libc::IPPROTO_UDP as u8));
            r.add_expr(&Payload::Transport(TransportHeaderField::Udp(UdpHeaderField::Dport)));
            let be = port.to_be_bytes();
            r.add_expr(&Cmp::new(CmpOp::Eq, &be[..]));
        }
        Match::IifName(name) => {
            r.add_expr(&Meta::IifName);
            r.add_expr(&Cmp::new(CmpOp::Eq, InterfaceName::Exact(cstring("interface", name)?)));
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Field {
    Saddr,
    Daddr,
}

/// `ip[6] saddr|daddr [!=] net`: load the address, mask it (unless a host prefix), compare to
/// the network. A network of the other family than the table's is a bug of ours, reported.
fn prefix(r: &mut Rule<'_>, field: Field, net: IpNet, op: CmpOp, family: ProtoFamily) -> Result<()> {
    match (net, family) {
        (IpNet::V4(net), ProtoFamily::Ipv4) => prefix4(r, field, net, op),
        (IpNet::V6(net), ProtoFamily::Ipv6) => prefix6(r, field, net, op),
        (net, family) => {
            return Err(Error::invalid(format!("network {net}"), format!("in a table of family {}", family_name(family))))
        }
    }
    Ok(())
}

fn prefix4(r: &mut Rule<'_>, field: Field, net: Ipv4Net, op: CmpOp) {
    let field = match field {
        Field::Saddr => Ipv4HeaderField::Saddr,
        Field::Daddr => Ipv4HeaderField::Daddr,
    };
    r.add_expr(&Payload::Network(NetworkHeaderField::Ipv4(field)));
    if net.prefix_len() < 32 {
        r.add_expr(&Bitwise::new(net.netmask(), 0u32));
    }
    r.add_expr(&Cmp::new(op, net.network()));
}

fn prefix6(r: &mut Rule<'_>, field: Field, net: Ipv6Net, op: CmpOp) {
    let field = match field {
        Field::Saddr => Ipv6HeaderField::Saddr,
        Field::Daddr => Ipv6HeaderField::Daddr,
    };
    r.add_expr(&Payload::Network(NetworkHeaderField::Ipv6(field)));
    if net.prefix_len() < 128 {
        r.add_expr(&Bitwise::new(net.netmask(), Ipv6Addr::UNSPECIFIED));
    }
    r.add_expr(&Cmp::new(op, net.network()));
}
