//! `unix:PATH` and `tcp:HOST:PORT` targets, as ovs-ofctl names them.

use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use super::error::SwitchError;

pub(crate) type BoxRead = Pin<Box<dyn AsyncRead + Send>>;
pub(crate) type BoxWrite = Pin<Box<dyn AsyncWrite + Send>>;

/// Where the switch listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Unix(std::path::PathBuf),
    Tcp(String),
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, SwitchError> {
        if let Some(p) = s.strip_prefix("unix:") {
            if !p.is_empty() {
                return Ok(Target::Unix(p.into()));
            }
        } else if let Some(a) = s.strip_prefix("tcp:") {
            if a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) {
                return Ok(Target::Tcp(a.to_string()));
            }
        }
        Err(SwitchError::BadAddress(s.to_string()))
    }

    pub(crate) async fn connect(&self) -> std::io::Result<(BoxRead, BoxWrite)> {
        match self {
            Target::Unix(p) => {
                let (r, w) = UnixStream::connect(p).await?.into_split();
                Ok((Box::pin(r), Box::pin(w)))
            }
            Target::Tcp(a) => {
                let s = TcpStream::connect(a).await?;
                s.set_nodelay(true)?;
                let (r, w) = s.into_split();
                Ok((Box::pin(r), Box::pin(w)))
            }
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
            Target::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(Target::parse("unix:/run/br0.mgmt").unwrap(), Target::Unix("/run/br0.mgmt".into()));
        assert_eq!(Target::parse("tcp:127.0.0.1:6653").unwrap(), Target::Tcp("127.0.0.1:6653".into()));
        for bad in ["", "unix:", "tcp:1.2.3.4", "tcp::80", "ssl:1.2.3.4:6653", "/run/br0.mgmt"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
