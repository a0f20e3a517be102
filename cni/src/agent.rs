//! One HTTP/1.1 request to the agent over its unix socket, under a single deadline.
//!
//! Blocking std on purpose: the plugin runs once per pod sandbox and exits, so an async
//! runtime would only add start-up time and dependencies. The deadline covers connect, write
//! and read together, because the runtime's own timeout is for the whole invocation.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};


/// The header that carries the request's deadline to the agent: milliseconds since the Unix
/// epoch (plugin and agent share the node's clock). The agent does not start a request whose
/// deadline has passed, and does not work past it: once the plugin has given up, the runtime
/// considers the ADD failed, and a pod set up after that would be one nobody asked for.
pub const DEADLINE_HEADER: &str = "sdn-deadline";

/// The value of [`DEADLINE_HEADER`] for a deadline `timeout` from now.
pub fn deadline_value(timeout: Duration) -> String {
    let at = std::time::SystemTime::now() + timeout;
    at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0).to_string()
}

/// The largest reply accepted: a result is a few hundred bytes, so anything near this is a
/// confused peer, and reading it all would only delay the error.
pub const MAX_REPLY_BYTES: usize = 1 << 20;

pub use crate::wire::Request;

/// The status and body of the agent's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Why no answer was had.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The socket could not be connected (no agent, wrong path, permissions).
    #[error("connect to {}: {source}", path.display())]
    Connect { path: PathBuf, source: io::Error },
    /// The deadline passed during `phase` (connect, write or read).
    #[error("no answer within {timeout:?} (deadline passed during {phase})")]
    Timeout { phase: &'static str, timeout: Duration },
    /// The connection failed after it was made.
    #[error("{phase}: {source}")]
    Io { phase: &'static str, source: io::Error },
    /// The bytes received are not an HTTP/1.x response this client understands.
    #[error("malformed HTTP reply: {0}")]
    Malformed(String),
}

fn remaining(deadline: Instant, timeout: Duration, phase: &'static str) -> Result<Duration, ExchangeError> {
    match deadline.checked_duration_since(Instant::now()) {
        // set_*_timeout rejects a zero duration, and a zero left means the deadline passed.
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(ExchangeError::Timeout { phase, timeout }),
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Connects with a deadline. std has no connect timeout for unix sockets, and connect blocks
/// when the agent's accept backlog is full (a wedged agent), so the connect runs on a helper
/// thread that is abandoned if the deadline passes; the process exits soon after anyway.
fn connect(path: &Path, deadline: Instant, timeout: Duration) -> Result<UnixStream, ExchangeError> {
    let wait = remaining(deadline, timeout, "connect")?;
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    let spawned = std::thread::Builder::new().name("agent-connect".into()).spawn(move || {
        let _ = tx.send(UnixStream::connect(&p));
    });
    let result = match spawned {
        Ok(_) => match rx.recv_timeout(wait) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(ExchangeError::Timeout { phase: "connect", timeout }),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(io::Error::other("the connecting thread ended without a result"))
            }
        },
        // No thread to be had: connect inline rather than fail (it is nearly always instant).
        Err(_) => UnixStream::connect(path),
    };
    result.map_err(|source| ExchangeError::Connect { path: path.to_path_buf(), source })
}

/// Sends `POST {uri}` with a JSON `body` to the agent at `socket` and reads the full reply,
/// all within `timeout`.
pub fn post(socket: &Path, uri: &str, body: &[u8], timeout: Duration) -> Result<Reply, ExchangeError> {
    let deadline = Instant::now() + timeout;
    let mut stream = connect(socket, deadline, timeout)?;

    let mut msg = format!(
        "POST {uri} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: sdn-node-cni/{}\r\nContent-Type: application/json\r\n\
         Accept: application/json\r\n{DEADLINE_HEADER}: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION"),
        // What is left of the deadline once connected (a connect that waited in a full
        // backlog used some of it).
        deadline_value(deadline.saturating_duration_since(Instant::now())),
        body.len()
    )
    .into_bytes();
    msg.extend_from_slice(body);
    let mut written = 0;
    while written < msg.len() {
        let wait = remaining(deadline, timeout, "write")?;
        stream.set_write_timeout(Some(wait)).map_err(|source| ExchangeError::Io { phase: "write", source })?;
        match stream.write(&msg[written..]) {
            Ok(0) => {
                return Err(ExchangeError::Io { phase: "write", source: io::ErrorKind::WriteZero.into() });
            }
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(ExchangeError::Timeout { phase: "write", timeout }),
            Err(source) => return Err(ExchangeError::Io { phase: "write", source }),
        }
    }

    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(reply) = parse_reply(&buf, false)? {
            return Ok(reply);
        }
        let wait = remaining(deadline, timeout, "read")?;
        stream.set_read_timeout(Some(wait)).map_err(|source| ExchangeError::Io { phase: "read", source })?;
        match stream.read(&mut chunk) {
            // Nothing at all before the close: the agent went away mid-request (restart).
            Ok(0) if buf.is_empty() => {
                return Err(ExchangeError::Io {
                    phase: "read",
                    source: io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed without an answer"),
                })
            }
            Ok(0) => {
                return parse_reply(&buf, true)?
                    .ok_or_else(|| ExchangeError::Malformed("connection closed before the reply was complete".into()))
            }
            Ok(n) => {
                if buf.len() + n > MAX_REPLY_BYTES {
                    return Err(ExchangeError::Malformed(format!("reply larger than {MAX_REPLY_BYTES} bytes")));
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(ExchangeError::Timeout { phase: "read", timeout }),
            Err(source) => return Err(ExchangeError::Io { phase: "read", source }),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses `buf` as an HTTP/1.x response: `Ok(None)` while more bytes are needed (`eof` says
/// none will come, which completes a body delimited by the connection's close).
pub fn parse_reply(mut buf: &[u8], eof: bool) -> Result<Option<Reply>, ExchangeError> {
    // A loop, not recursion: a peer could send thousands of interim answers.
    loop {
        match parse_message(buf, eof)? {
            None => return Ok(None),
            Some(Message::Interim(len)) => buf = &buf[len..],
            Some(Message::Final(reply)) => return Ok(Some(reply)),
        }
    }
}

enum Message {
    /// A 1xx answer of this many bytes (no body), to be skipped.
    Interim(usize),
    Final(Reply),
}

fn parse_message(buf: &[u8], eof: bool) -> Result<Option<Message>, ExchangeError> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        if buf.len() > 64 * 1024 {
            return Err(ExchangeError::Malformed("header section longer than 64 KiB".into()));
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| ExchangeError::Malformed("header section is not UTF-8".into()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (Some(proto), Some(code)) = (parts.next(), parts.next()) else {
        return Err(ExchangeError::Malformed(format!("status line {status_line:?}")));
    };
    if !proto.starts_with("HTTP/1.") {
        return Err(ExchangeError::Malformed(format!("status line {status_line:?}")));
    }
    let status: u16 = match code.parse() {
        Ok(s) if (100..=999).contains(&s) => s,
        _ => return Err(ExchangeError::Malformed(format!("status line {status_line:?}"))),
    };
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ExchangeError::Malformed(format!("header line {line:?}")));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.parse().map_err(|_| ExchangeError::Malformed(format!("Content-Length {value:?}")))?;
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().split(',').any(|t| t.trim() == "chunked");
        }
    }
    let rest = &buf[head_end + 4..];
    // Interim 1xx answers carry no body; skip to the final one.
    if (100..200).contains(&status) {
        return Ok(Some(Message::Interim(head_end + 4)));
    }
    let body = if chunked {
        match dechunk(rest)? {
            Some(b) => b,
            None if eof => return Err(ExchangeError::Malformed("chunked body cut short".into())),
            None => return Ok(None),
        }
    } else if let Some(n) = content_length {
        if n > MAX_REPLY_BYTES {
            return Err(ExchangeError::Malformed(format!("Content-Length {n} is over {MAX_REPLY_BYTES}")));
        }
        if rest.len() < n {
            if eof {
                return Err(ExchangeError::Malformed(format!("body cut short ({} of {n} bytes)", rest.len())));
            }
            return Ok(None);
        }
        rest[..n].to_vec()
    } else if status == 204 || status == 304 {
        Vec::new()
    } else if eof {
        rest.to_vec()
    } else {
        return Ok(None);
    };
    Ok(Some(Message::Final(Reply { status, body })))
}

/// Decodes a chunked body; `Ok(None)` while incomplete. Trailers are skipped.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, ExchangeError> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = find(rest, b"\r\n") else { return Ok(None) };
        let line = std::str::from_utf8(&rest[..line_end])
            .map_err(|_| ExchangeError::Malformed("chunk size line is not UTF-8".into()))?;
        let size_hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| ExchangeError::Malformed(format!("chunk size {size_hex:?}")))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            // Trailer section, ended by an empty line.
            return Ok(find(rest, b"\r\n").map(|_| out));
        }
        if size > MAX_REPLY_BYTES || out.len() + size > MAX_REPLY_BYTES {
            return Err(ExchangeError::Malformed(format!("chunk of {size} bytes is over {MAX_REPLY_BYTES}")));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&rest[..size]);
        if &rest[size..size + 2] != b"\r\n" {
            return Err(ExchangeError::Malformed("chunk not followed by CRLF".into()));
        }
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(s: &str, eof: bool) -> Result<Option<Reply>, ExchangeError> {
        parse_reply(s.as_bytes(), eof)
    }

    #[test]
    fn content_length_and_eof() {
        let r = reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", false).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{}"[..]));
        assert!(reply("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}", false).unwrap().is_none());
        assert!(reply("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}", true).is_err());
        assert!(reply("HTTP/1.1 404 Not Found\r\n\r\nabc", false).unwrap().is_none());
        assert_eq!(reply("HTTP/1.0 404 Not Found\r\n\r\nabc", true).unwrap().unwrap().body, b"abc");
        assert!(reply("HTTP/1.1 200 OK\r\ncontent", true).unwrap().is_none());
    }

    #[test]
    fn chunked() {
        let s = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(reply(s, false).unwrap().unwrap().body, b"abcde");
        assert!(reply(&s[..s.len() - 2], false).unwrap().is_none());
        assert!(reply(&s[..s.len() - 2], true).is_err());
        assert!(reply("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false).is_err());
    }

    /// Mangled and truncated replies never panic (a confused or hostile peer on the socket).
    #[test]
    fn mangled_replies_do_not_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let base: &[&[u8]] = &[
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        ];
        for _ in 0..20_000 {
            let mut b = base[(rnd() % 2) as usize].to_vec();
            for _ in 0..(rnd() % 4) {
                let i = (rnd() as usize) % b.len();
                match rnd() % 3 {
                    0 => b[i] = rnd() as u8,
                    1 => b.truncate(i),
                    _ => b.insert(i, b"0123456789abcdef\r\n: ;-"[(rnd() % 22) as usize]),
                }
                if b.is_empty() {
                    break;
                }
            }
            let _ = parse_reply(&b, rnd() % 2 == 0);
        }
        let many = "HTTP/1.1 100 Continue\r\n\r\n".repeat(50_000);
        assert!(parse_reply(many.as_bytes(), true).unwrap().is_none());
    }

    #[test]
    fn interim_and_garbage() {
        let r = reply("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(r.status, 204);
        for bad in ["SSH-2.0\r\n\r\n", "HTTP/1.1 abc\r\n\r\n", "HTTP/1.1 200 OK\r\nnocolon\r\n\r\n", "HTTP/1.1\r\n\r\n"]
        {
            assert!(reply(bad, true).is_err(), "{bad:?}");
        }
        assert!(reply("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", false).is_err());
        assert!(parse_reply(b"HTTP/1.1 200 OK\r\nX: \xff\r\n\r\n", true).is_err());
    }
}
