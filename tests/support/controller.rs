//! `sdn-node controller` as a child process against the fake API server: its stderr followed,
//! its /status and /readyz on a port of its own, SIGKILLed and reaped when dropped.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::agent::Lines;
use super::fake_kube::FakeKube;

pub struct Controller {
    child: tokio::process::Child,
    pub log: Lines,
    pid: i32,
    pub health: String,
    pub identity: String,
}

/// The flags every test controller gets: the network of the examples (10.128.0.0/14, /23 per
/// node), short leader-election periods, and `extra` (flag and value pairs; a flag in `extra`
/// replaces its default here, and with an empty value leaves the flag out: the controller's
/// own default then holds).
pub fn args(identity: &str, health: &str, extra: &[&str]) -> Vec<String> {
    let defaults: [(&str, &str); 10] = [
        ("--cluster-network", "10.128.0.0/14"),
        ("--host-subnet-length", "9"),
        ("--service-network", "172.30.0.0/16"),
        ("--namespace", "sdn-node"),
        ("--identity", identity),
        ("--health-addr", health),
        ("--leader-elect-lease-duration", "3"),
        ("--leader-elect-renew-deadline", "2"),
        ("--leader-elect-retry-period", "0.5"),
        ("--api-timeout", "2"),
    ];
    let mut a: Vec<String> = vec!["controller".into()];
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            a.push(flag.into());
            a.push(value.into());
        }
    }
    let mut rest = extra.iter().peekable();
    while let Some(x) = rest.next() {
        if x.starts_with("--") && rest.peek().is_some_and(|v| v.is_empty()) {
            rest.next();
            continue;
        }
        a.push(x.to_string());
    }
    a
}

impl Controller {
    pub fn spawn(fake: &FakeKube, dir: &std::path::Path, identity: &str, extra: &[&str]) -> Controller {
        let health =
            format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
        let kubeconfig = fake.kubeconfig(dir);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
            .args(args(identity, &health, extra))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sdn-node controller");
        let pid = child.id().expect("a running child has a pid") as i32;
        let log = Lines::follow(child.stderr.take().expect("piped stderr"));
        Controller { child, log, pid, health, identity: identity.into() }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn log_text(&self) -> String {
        self.log.all().join("\n")
    }

    /// GET on the health port: (code, body), or (0, why) when nothing answers yet.
    pub async fn get(&self, path: &str) -> (u16, String) {
        super::inproc::try_http_get(&self.health, path).await.unwrap_or_else(|e| (0, e))
    }

    pub async fn status(&self) -> Option<Value> {
        let (code, body) = self.get("/status").await;
        (code == 200).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    /// Polls /status until `pred` holds (bounded: 600 polls 50 ms apart); panics with the last
    /// status and the log otherwise.
    pub async fn wait(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        for _ in 0..600 {
            if let Some(s) = self.status().await {
                if pred(&s) {
                    return s;
                }
                last = s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: not reached; last status: {last:#}\n---- controller log ----\n{}", self.log_text());
    }

    /// Leading, listed, and nothing left to do — in two reports of the loop at least 600 ms
    /// apart (it reports every 500 ms: one report may predate the last change).
    pub async fn settled(&self, what: &str) -> Value {
        let done = |s: &Value| s["leading"] == true && s["synced"] == true && s["pending"] == 0;
        for _ in 0..100 {
            self.wait(what, done).await;
            tokio::time::sleep(Duration::from_millis(600)).await;
            if let Some(s) = self.status().await.filter(done) {
                return s;
            }
        }
        panic!("{what}: never settled\n{}", self.log_text());
    }

    /// /readyz answers 200 (bounded), as every test that changes something ends.
    pub async fn ready_again(&self, what: &str) {
        let mut last = (0, String::new());
        for _ in 0..400 {
            last = self.get("/readyz").await;
            if last.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: /readyz never answered 200; last: {} {}\n{}", last.0, last.1, self.log_text());
    }

    pub fn kill9(&mut self) {
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
        }
    }

    pub fn term(&self) {
        unsafe {
            libc::kill(self.pid, libc::SIGTERM);
        }
    }

    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.expect("controller exits").expect("wait")
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- controller {} ({}) log ----\n{}\n---- end ----", self.identity, self.pid, self.log_text());
        }
        let _ = self.child.start_kill();
        for _ in 0..200 {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}
