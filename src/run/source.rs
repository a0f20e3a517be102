//! The state-file source: watches the file (inotify, through `notify`) and publishes each new
//! valid state. A file that fails to parse keeps the last good state; the error is logged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use crate::cluster::state_file;

pub use crate::cluster::Loaded;

/// Loads the file once and then follows it. The returned receiver always holds the last good
/// state (`None` until the file first parses). The watcher lives as long as the task.
pub fn watch_file(path: PathBuf) -> watch::Receiver<Option<Arc<Loaded>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let (ev_tx, mut ev_rx) = mpsc::channel::<()>(16);
        // Watch the directory: editors and `kubectl cp` replace the file rather than write it.
        let dir = path.parent().map(Path::to_path_buf).filter(|d| !d.as_os_str().is_empty()).unwrap_or_else(|| ".".into());
        let name = path.file_name().map(|n| n.to_owned());
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res {
                // Reads (ours included) are not changes.
                let change = matches!(ev.kind, notify::EventKind::Create(_) | notify::EventKind::Modify(_) | notify::EventKind::Remove(_));
                if change && ev.paths.iter().any(|p| p.file_name() == name.as_deref()) {
                    let _ = ev_tx.try_send(());
                }
            }
        });
        let _watcher = match watcher {
            Ok(mut w) => match w.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => Some(w),
                Err(e) => {
                    error!(dir = %dir.display(), error = %e, "cannot watch the state file's directory; changes will not be picked up");
                    None
                }
            },
            Err(e) => {
                error!(error = %e, "cannot start a file watcher; changes will not be picked up");
                None
            }
        };
        let mut last = None;
        load_into(&path, &tx, &mut last);
        while ev_rx.recv().await.is_some() {
            // Debounce: an editor's save is several events.
            tokio::time::sleep(Duration::from_millis(50)).await;
            while ev_rx.try_recv().is_ok() {}
            load_into(&path, &tx, &mut last);
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// Loads the file unless its content is what was loaded last.
fn load_into(path: &Path, tx: &watch::Sender<Option<Arc<Loaded>>>, last: &mut Option<String>) {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            error!(path = %path.display(), error = %e, "cannot read the state file; keeping the last good state");
            return;
        }
    };
    if last.as_deref() == Some(text.as_str()) {
        return;
    }
    let parsed = state_file::parse(&text).map_err(|crate::cluster::Fatal(m)| crate::cluster::Fatal(format!("{}: {m}", path.display())));
    *last = Some(text);
    match parsed {
        Ok((state, problems)) => {
            for p in &problems {
                warn!(object = %p.object, field = %p.field, "rejected: {}", p.message);
            }
            info!(path = %path.display(), pods = state.pods.len(), rejected = problems.len(), "state loaded");
            tx.send_replace(Some(Arc::new(Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default() })));
        }
        Err(e) => {
            let kept = if tx.borrow().is_some() { "keeping the last good state" } else { "no state applied yet" };
            error!(error = %e, "state file rejected; {kept}");
        }
    }
}
