//! Real traffic between harness pods (tests/support/nodes.rs), of either family: a bulk TCP
//! echo, a UDP datagram and its echo, a policy probe connection, a multicast datagram and who
//! got it. Shared by the dual-stack and IPv6-only tests, which ask the same questions of
//! different address plans.

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::nodes::{in_netns, Pod};

/// Bound of one exchange.
const BOUND: Duration = Duration::from_secs(30);

/// `client` sends 256 KiB (full-size segments) over TCP to `server` at `dst:port` (one of
/// `server`'s addresses) and gets them back intact; panics otherwise.
pub async fn tcp_bulk_echo(client: &Pod, server: &Pod, dst: IpAddr, port: u16) {
    const LEN: usize = 256 * 1024;
    let l = if dst.is_ipv6() { server.tcp_listen6(port).await } else { server.tcp_listen(port).await };
    let listener = tokio::net::TcpListener::from_std(l).expect("tokio listener");
    let echo = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut buf = vec![0u8; LEN];
        s.read_exact(&mut buf).await.expect("server reads");
        s.write_all(&buf).await.expect("server echoes");
        s.shutdown().await.expect("server shuts down");
    });
    let exchange = async {
        let s = client.tcp_connect(dst, port, Duration::from_secs(10)).await.expect("connect");
        let mut s = tokio::net::TcpStream::from_std(s).expect("tokio stream");
        let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
        let (mut r, mut w) = s.split();
        let mut back = Vec::with_capacity(LEN);
        let (wr, rd) = tokio::join!(w.write_all(&data), r.read_to_end(&mut back));
        wr.expect("client writes");
        rd.expect("client reads");
        assert!(back == data, "echo to {dst} differs: {} bytes back of {LEN}", back.len());
    };
    tokio::time::timeout(BOUND, exchange).await.expect("TCP echo within the bound");
    tokio::time::timeout(BOUND, echo).await.expect("server done").expect("server task");
}

/// `client` sends `payload` over UDP to `server` at `dst:port` and gets it back; panics
/// otherwise. A few sends: the first may wait for address resolution and be dropped by the
/// kernel's queue limit.
pub async fn udp_echo(client: &Pod, server: &Pod, dst: IpAddr, port: u16, payload: &'static [u8]) {
    let any = if dst.is_ipv6() { "::" } else { "0.0.0.0" };
    let s = in_netns(&server.netns, move || std::net::UdpSocket::bind((any, port))).await.expect("bind the server");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        let (n, from) = s.recv_from(&mut buf).expect("server receives the datagram");
        s.send_to(&buf[..n], from).expect("server echoes");
    });
    let c = in_netns(&client.netns, move || std::net::UdpSocket::bind((any, 0))).await.expect("bind the client");
    c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let got = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 1500];
        for _ in 0..3 {
            c.send_to(payload, (dst, port)).expect("send");
            if let Ok((n, _)) = c.recv_from(&mut buf) {
                return Some(buf[..n].to_vec());
            }
        }
        None
    })
    .await
    .expect("join");
    assert_eq!(got.as_deref(), Some(payload), "UDP echo from {dst}");
    echo.join().expect("echo thread");
}

/// A new TCP connection from `from` to `dst:port` whose server echoes: true if it did.
pub async fn connects(from: &Pod, dst: IpAddr, port: u16) -> bool {
    let Ok(s) = from.tcp_connect(dst, port, Duration::from_millis(1500)).await else { return false };
    let Ok(mut s) = tokio::net::TcpStream::from_std(s) else { return false };
    let ok = async {
        s.write_all(b"np").await.ok()?;
        let mut b = [0u8; 2];
        s.read_exact(&mut b).await.ok()?;
        (&b == b"np").then_some(())
    };
    tokio::time::timeout(Duration::from_secs(3), ok).await.ok().flatten().is_some()
}

/// `sender` sends three datagrams to `group:port`; each member joined the group first, and
/// must receive one (`true`) or nothing (`false`) within three seconds. Panics otherwise.
pub async fn multicast_reaches(sender: &Pod, group: IpAddr, port: u16, members: &[(&Pod, bool)]) {
    let mut receivers = Vec::new();
    for (member, expect) in members {
        let sock = in_netns(&member.netns, move || -> std::io::Result<std::net::UdpSocket> {
            match group {
                IpAddr::V6(g) => {
                    let s = std::net::UdpSocket::bind(("::", port))?;
                    s.join_multicast_v6(&g, 0)?;
                    Ok(s)
                }
                IpAddr::V4(g) => {
                    let s = std::net::UdpSocket::bind(("0.0.0.0", port))?;
                    s.join_multicast_v4(&g, &std::net::Ipv4Addr::UNSPECIFIED)?;
                    Ok(s)
                }
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{} joins {group}: {e}", member.name));
        sock.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
        receivers.push((member.name.clone(), *expect, tokio::task::spawn_blocking(move || {
            let mut buf = [0u8; 64];
            sock.recv_from(&mut buf).ok().map(|(n, _)| buf[..n].to_vec())
        })));
    }
    let out = in_netns(&sender.netns, move || std::net::UdpSocket::bind(if group.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }))
        .await
        .expect("sender socket");
    for _ in 0..3 {
        out.send_to(b"group", (group, port)).expect("send to the group");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (name, expect, r) in receivers {
        let got = r.await.expect("receiver");
        assert_eq!(got.is_some(), expect, "{name} on {group}: received {got:?}, expected {}", if expect { "the datagram" } else { "nothing" });
    }
}
