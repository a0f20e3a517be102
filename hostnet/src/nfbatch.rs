//! Translation of the rule model (`firewall`) into an nf_tables netlink batch with nftnl, and
//! its installation (one atomic batch) in a namespace.
//! Each message's description is kept in batch order so a kernel NACK can name the object.

use std::ffi::CString;

use ipnet::Ipv4Net;
use nftnl::{
    expr::{
        Bitwise, Cmp, CmpOp, Conntrack, InterfaceName, Ipv4HeaderField, Masquerade, Meta, NetworkHeaderField, Payload,
        States, TransportHeaderField, UdpHeaderField, Verdict,
    },
    Batch, Chain, ChainType, FinalizedBatch, Hook, MsgType, Policy, ProtoFamily, Rule, Table,
};

use crate::{
    error::{Error, Result},
    firewall::{self, Action, ChainId, FirewallConfig, Match, RuleSpec},
    netns::Netns,
    nfnl,
};

/// Installs (or atomically replaces) the rule set in namespace `ns`.
pub async fn install_firewall(ns: &Netns, cfg: &FirewallConfig) -> Result<()> {
    cfg.validate()?;
    let cfg = cfg.clone();
    ns.run(&format!("install nftables table ip {}", cfg.table), move || {
        let (batch, names) = install_batch(&cfg.table, &firewall::rules(&cfg))?;
        nfnl::send_batch(&batch, &names)
    })
    .await
}

/// Removes our table from namespace `ns`; a missing table is success.
pub async fn remove_firewall(ns: &Netns, table: &str) -> Result<()> {
    firewall::check_table_name(table)?;
    let table = table.to_string();
    ns.run(&format!("remove nftables table ip {table}"), move || {
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

/// "Create if missing, delete, create": the first add makes the delete valid whether or not
/// the table existed (NEWTABLE on an existing table without NLM_F_EXCL is a no-op).
pub(crate) fn install_batch(table_name: &str, rules: &[RuleSpec]) -> Result<Described> {
    let table = Table::new(cstring("table", table_name)?, ProtoFamily::Ipv4);
    let tname = format!("table ip {table_name}");
    let mut batch = Batch::new();
    let mut names = Vec::new();
    for (op, what) in [(MsgType::Add, "ensure"), (MsgType::Del, "delete"), (MsgType::Add, "add")] {
        batch.add(&table, op);
        names.push(format!("{what} {tname}"));
    }
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
        batch.add(&rule(c, spec)?, MsgType::Add);
        names.push(format!("add rule {i} ({}) in chain {} of {tname}", spec.comment, spec.chain.name()));
    }
    Ok((batch.finalize(), names))
}

/// "Create if missing, delete": removal that succeeds whether or not the table exists.
pub(crate) fn remove_batch(table_name: &str) -> Result<Described> {
    let table = Table::new(cstring("table", table_name)?, ProtoFamily::Ipv4);
    let mut batch = Batch::new();
    batch.add(&table, MsgType::Add);
    batch.add(&table, MsgType::Del);
    let names = vec![format!("ensure table ip {table_name}"), format!("delete table ip {table_name}")];
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

fn rule<'a>(chain: &'a Chain<'_>, spec: &RuleSpec) -> Result<Rule<'a>> {
    let mut r = Rule::new(chain);
    for m in &spec.matches {
        add_match(&mut r, m)?;
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

fn add_match(r: &mut Rule<'_>, m: &Match) -> Result<()> {
    match m {
        Match::SaddrIn(net) => prefix(r, Ipv4HeaderField::Saddr, *net, CmpOp::Eq),
        Match::DaddrIn(net) => prefix(r, Ipv4HeaderField::Daddr, *net, CmpOp::Eq),
        Match::DaddrNotIn(net) => prefix(r, Ipv4HeaderField::Daddr, *net, CmpOp::Neq),
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

/// `ip saddr|daddr [!=] net`: load the address, mask it (unless /32), compare to the network.
fn prefix(r: &mut Rule<'_>, field: Ipv4HeaderField, net: Ipv4Net, op: CmpOp) {
    r.add_expr(&Payload::Network(NetworkHeaderField::Ipv4(field)));
    if net.prefix_len() < 32 {
        r.add_expr(&Bitwise::new(net.netmask(), 0u32));
    }
    r.add_expr(&Cmp::new(op, net.network()));
}
