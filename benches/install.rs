//! Flow installation on a real ovs-vswitchd, against `ovs-ofctl --bundle add-flows` measured in
//! the same run: 10k flows pipelined (FLOW_MODs back to back + one barrier), 10k and 1k flows as
//! one atomic bundle. Every sample starts from an empty table; clearing it is not measured.
//!
//! `cargo bench --bench install` (needs Open vSwitch installed; uses a private switch).

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use openflow::{Action, FlowMod, FlowModCommand, Ipv4Match, Masked, Match, OFPTT_ALL};
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};
use sdn_node::switch::{Switch, SwitchOptions};

fn pod_flow(i: u32) -> FlowMod {
    let ip = Ipv4Addr::from(0x0a80_0000 + i);
    FlowMod::add(
        70,
        100,
        Match::any().ipv4(Ipv4Match { dst: Some(Masked::exact(ip)), ..Default::default() }),
        vec![Action::load_reg(1, i % 4096), Action::load_reg(2, 3 + i % 60000)],
        Some(80),
    )
}

struct Env {
    rt: tokio::runtime::Runtime,
    sb: OvsSandbox,
    sw: Switch,
}

impl Env {
    fn new() -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (sb, sw) = rt.block_on(async {
            let sb = OvsSandbox::start(SandboxOptions::default()).await.unwrap();
            sb.add_bridge("br0", "dummy").await.unwrap();
            let sw = Switch::connect(&format!("unix:{}", sb.mgmt_socket("br0").display()), SwitchOptions::default())
                .await
                .unwrap();
            (sb, sw)
        });
        Env { rt, sb, sw }
    }

    fn clear(&self) {
        let del = FlowMod::new(FlowModCommand::Delete, OFPTT_ALL, 0x8000, Match::any());
        self.rt.block_on(self.sw.send_flow_mods(&[del])).unwrap();
    }

    fn ofctl_bundle(&self, file: &std::path::Path) -> Duration {
        let t = Instant::now();
        let out = Command::new("ovs-ofctl")
            .args(["-O", "OpenFlow13", "--bundle", "add-flows", "br0"])
            .arg(file)
            .envs(self.sb.ovs_env())
            .output()
            .unwrap();
        let d = t.elapsed();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        d
    }
}

fn flows_file(flows: &[FlowMod]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    for fm in flows {
        // Our Display is ovs-ofctl's flow syntax (checked by the openflow oracle tests).
        writeln!(f, "{fm}").unwrap();
    }
    f.flush().unwrap();
    f
}

fn bench(c: &mut Criterion) {
    let env = Env::new();
    for n in [10_000u32, 1_000] {
        let flows: Vec<FlowMod> = (0..n).map(pod_flow).collect();
        let file = flows_file(&flows);
        let mut g = c.benchmark_group(format!("install_{n}"));
        g.throughput(Throughput::Elements(n as u64));
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(if n > 1000 { 20 } else { 8 }));
        if n > 1000 {
            g.bench_function("sdn-node pipelined+barrier", |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        env.clear();
                        let t = Instant::now();
                        env.rt.block_on(env.sw.send_flow_mods(&flows)).unwrap();
                        total += t.elapsed();
                    }
                    total
                })
            });
        }
        g.bench_function("sdn-node bundle", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    env.clear();
                    let mut bundle = env.sw.bundle();
                    bundle.extend(flows.iter().cloned());
                    let t = Instant::now();
                    env.rt.block_on(bundle.commit()).unwrap();
                    total += t.elapsed();
                }
                total
            })
        });
        g.bench_function("ovs-ofctl --bundle add-flows", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    env.clear();
                    total += env.ofctl_bundle(file.path());
                }
                total
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
