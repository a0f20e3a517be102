//! A fake Kubernetes API server for the kube source: real HTTP list and watch (newline-delimited
//! JSON events with resourceVersions, bookmarks when asked for), field selectors, and the
//! failures a watcher must survive: 403 on list, 410 Gone on a watch from a compacted
//! resourceVersion, dropped watch connections. Nodes can be read and merge-patched; events can
//! be created and patched; every POST and PATCH is recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// (resource plural, namespace or "", name).
type Key = (String, String, String);

#[derive(Clone, Debug)]
struct Ev {
    rv: u64,
    resource: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<Ev>,
    /// Watches of this resource from an older resourceVersion get 410 Gone.
    compacted: BTreeMap<String, u64>,
    /// Listing (and watching) this resource answers 403.
    forbidden: BTreeSet<String>,
    /// Listing (and watching) this resource without a field selector answers 403.
    forbidden_unselected: BTreeSet<String>,
    /// The objects POSTed (events): (path, body).
    posts: Vec<(String, Value)>,
    /// Bumped to end the open watches of a resource.
    cut: BTreeMap<String, u64>,
    patches: Vec<(String, String, Value)>,
    requests: Vec<String>,
}

#[derive(Clone)]
pub struct FakeKube {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<Option<Ev>>,
    pub addr: SocketAddr,
}

fn api_version(resource: &str) -> &'static str {
    match resource {
        "pods" | "services" | "nodes" | "namespaces" => "v1",
        "networkpolicies" => "networking.k8s.io/v1",
        _ => "network.openshift.io/v1",
    }
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "services" => "Service",
        "nodes" => "Node",
        "namespaces" => "Namespace",
        "networkpolicies" => "NetworkPolicy",
        "clusternetworks" => "ClusterNetwork",
        "hostsubnets" => "HostSubnet",
        "netnamespaces" => "NetNamespace",
        "egressnetworkpolicies" => "EgressNetworkPolicy",
        _ => "Unknown",
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn respond(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// `a.b.c=v` field selectors, comma-separated.
fn selected(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else { return true };
    sel.split(',').all(|term| {
        let Some((path, want)) = term.split_once('=') else { return true };
        let mut v = obj;
        for part in path.split('.') {
            v = &v[part];
        }
        v.as_str().unwrap_or_default() == want
    })
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.replace("%3D", "=").replace("%2C", ",").replace("%2F", "/")))
        .collect()
}

impl FakeKube {
    pub async fn start() -> FakeKube {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (events, _) = broadcast::channel(4096);
        let fake = FakeKube { inner: Arc::new(Mutex::new(Inner { rv: 100, ..Default::default() })), events, addr };
        let f = fake.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let f = f.clone();
            async move { f.handle(method, uri, &headers, body) }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        fake
    }

    /// A kubeconfig (no auth) pointing at this server.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: u\ncurrent-context: fake\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn key(resource: &str, obj: &Value) -> Key {
        let m = &obj["metadata"];
        (
            resource.to_string(),
            m["namespace"].as_str().unwrap_or_default().to_string(),
            m["name"].as_str().unwrap_or_default().to_string(),
        )
    }

    /// Creates or replaces an object (ADDED or MODIFIED).
    pub fn put(&self, resource: &str, mut obj: Value) {
        let mut g = self.inner.lock().unwrap();
        g.rv += 1;
        let rv = g.rv;
        obj["apiVersion"] = json!(api_version(resource));
        obj["kind"] = json!(kind_of(resource));
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = Self::key(resource, &obj);
        let kind = if g.objects.insert(key, obj.clone()).is_some() { "MODIFIED" } else { "ADDED" };
        let ev = Ev { rv, resource: resource.into(), kind, object: obj };
        g.log.push(ev.clone());
        let _ = self.events.send(Some(ev));
    }

    /// Deletes an object (DELETED).
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) {
        let mut g = self.inner.lock().unwrap();
        let Some(mut obj) = g.objects.remove(&(resource.into(), namespace.into(), name.into())) else {
            panic!("no {resource} {namespace}/{name}")
        };
        g.rv += 1;
        let rv = g.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let ev = Ev { rv, resource: resource.into(), kind: "DELETED", object: obj };
        g.log.push(ev.clone());
        let _ = self.events.send(Some(ev));
    }

    /// Deletes an object while the resource's watches are gone: the open watches are cut and
    /// the history is compacted, so the watcher's next watch gets 410 Gone and must relist.
    pub fn delete_while_disconnected(&self, resource: &str, namespace: &str, name: &str) {
        let mut g = self.inner.lock().unwrap();
        g.objects.remove(&(resource.into(), namespace.into(), name.into())).expect("object to delete");
        g.rv += 1;
        let rv = g.rv;
        g.compacted.insert(resource.into(), rv);
        *g.cut.entry(resource.into()).or_default() += 1;
        drop(g);
        let _ = self.events.send(None);
    }

    /// Ends the open watches of a resource (the connection drops; history is kept).
    pub fn drop_watches(&self, resource: &str) {
        *self.inner.lock().unwrap().cut.entry(resource.into()).or_default() += 1;
        let _ = self.events.send(None);
    }

    pub fn forbid(&self, resource: &str, forbidden: bool) {
        let mut g = self.inner.lock().unwrap();
        if forbidden {
            g.forbidden.insert(resource.into());
        } else {
            g.forbidden.remove(resource);
        }
    }

    /// Lists and watches of `resource` without a field selector answer 403 (a node allowed to
    /// see only its own pods).
    pub fn forbid_unselected(&self, resource: &str, forbidden: bool) {
        let mut g = self.inner.lock().unwrap();
        if forbidden {
            g.forbidden_unselected.insert(resource.into());
        } else {
            g.forbidden_unselected.remove(resource);
        }
    }

    /// The POST requests (events): (path, body).
    pub fn posts(&self) -> Vec<(String, Value)> {
        self.inner.lock().unwrap().posts.clone()
    }

    /// The PATCH requests: (path, content type, body).
    pub fn patches(&self) -> Vec<(String, String, Value)> {
        self.inner.lock().unwrap().patches.clone()
    }

    /// The requests so far (method and path with query).
    pub fn requests(&self) -> Vec<String> {
        self.inner.lock().unwrap().requests.clone()
    }

    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.inner.lock().unwrap().objects.get(&(resource.into(), namespace.into(), name.into())).cloned()
    }

    fn handle(&self, method: Method, uri: Uri, headers: &HeaderMap, body: Bytes) -> Response {
        self.inner.lock().unwrap().requests.push(format!("{method} {uri}"));
        let path = uri.path().to_string();
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        // /api/v1/[namespaces/NS/]RES[/NAME] or /apis/GROUP/v1/[namespaces/NS/]RES[/NAME]
        let rest: &[&str] = match segs.as_slice() {
            ["api", "v1", rest @ ..] => rest,
            ["apis", "network.openshift.io" | "networking.k8s.io" | "events.k8s.io", "v1", rest @ ..] => rest,
            _ => return respond(404, &status(404, "NotFound", "no such path")),
        };
        let (ns, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            _ => (None, rest),
        };
        let q = query(&uri);
        match (rest, method) {
            ([res], Method::GET) => {
                let unselected = !q.contains_key("fieldSelector") && self.inner.lock().unwrap().forbidden_unselected.contains(*res);
                if unselected || self.inner.lock().unwrap().forbidden.contains(*res) {
                    let msg = format!("{res} is forbidden: User \"system:node\" cannot list resource \"{res}\"");
                    return respond(403, &status(403, "Forbidden", &msg));
                }
                let sel = q.get("fieldSelector").map(String::as_str);
                if matches!(q.get("watch").map(String::as_str), Some("1" | "true")) {
                    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true" || v == "1");
                    return self.watch(res, ns, sel.map(str::to_string), from, bookmarks);
                }
                let g = self.inner.lock().unwrap();
                let items: Vec<Value> = g
                    .objects
                    .iter()
                    .filter(|((r, n, _), o)| r == res && ns.as_ref().is_none_or(|ns| ns == n) && selected(o, sel))
                    .map(|(_, o)| o.clone())
                    .collect();
                let list = json!({"apiVersion": api_version(res), "kind": format!("{}List", kind_of(res)),
                    "metadata": {"resourceVersion": g.rv.to_string()}, "items": items});
                respond(200, &list)
            }
            (["nodes", name], Method::GET) => match self.object("nodes", "", name) {
                Some(n) => respond(200, &n),
                None => respond(404, &status(404, "NotFound", "node not found")),
            },
            (["nodes", name], Method::PATCH) => {
                let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                    return respond(400, &status(400, "BadRequest", "not JSON"));
                };
                let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                self.inner.lock().unwrap().patches.push((path.clone(), ct, patch.clone()));
                let Some(mut node) = self.object("nodes", "", name) else {
                    return respond(404, &status(404, "NotFound", "node not found"));
                };
                merge(&mut node, &patch);
                self.put("nodes", node.clone());
                respond(200, &self.object("nodes", "", name).unwrap())
            }
            (["events"], Method::POST) => {
                let Ok(event) = serde_json::from_slice::<Value>(&body) else {
                    return respond(400, &status(400, "BadRequest", "not JSON"));
                };
                self.inner.lock().unwrap().posts.push((path.clone(), event.clone()));
                respond(201, &event)
            }
            (["events", _], Method::PATCH) => {
                let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                    return respond(400, &status(400, "BadRequest", "not JSON"));
                };
                let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                self.inner.lock().unwrap().patches.push((path.clone(), ct, patch.clone()));
                respond(200, &patch)
            }
            _ => respond(405, &status(405, "MethodNotAllowed", "not supported by the fake")),
        }
    }

    fn watch(&self, res: &str, ns: Option<String>, sel: Option<String>, from: u64, bookmarks: bool) -> Response {
        let res = res.to_string();
        let mut rx = self.events.subscribe();
        let (backlog, gone, cut, rv) = {
            let g = self.inner.lock().unwrap();
            let gone = g.compacted.get(&res).is_some_and(|c| from < *c);
            let backlog: Vec<Ev> = g.log.iter().filter(|e| e.rv > from && e.resource == res).cloned().collect();
            (backlog, gone, g.cut.get(&res).copied().unwrap_or(0), g.rv)
        };
        let inner = self.inner.clone();
        let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
        let line = |v: Value| Ok(Bytes::from(format!("{v}\n")));
        tokio::spawn(async move {
            let matches = |e: &Ev| {
                e.resource == res
                    && ns.as_ref().is_none_or(|n| e.object["metadata"]["namespace"].as_str() == Some(n))
                    && selected(&e.object, sel.as_deref())
            };
            if gone {
                let _ = tx
                    .send(line(json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")})))
                    .await;
                return;
            }
            let mut last = from;
            for e in backlog.iter().filter(|e| matches(e)) {
                last = e.rv;
                if tx.send(line(json!({"type": e.kind, "object": e.object}))).await.is_err() {
                    return;
                }
            }
            if bookmarks {
                let b = json!({"type": "BOOKMARK", "object": {"kind": kind_of(&res), "apiVersion": api_version(&res),
                    "metadata": {"resourceVersion": rv.max(last).to_string()}}});
                if tx.send(line(b)).await.is_err() {
                    return;
                }
            }
            loop {
                let ev = tokio::select! {
                    _ = tx.closed() => return,
                    ev = rx.recv() => ev,
                };
                if inner.lock().unwrap().cut.get(&res).copied().unwrap_or(0) != cut {
                    // The connection drops (the body ends).
                    return;
                }
                match ev {
                    Ok(Some(e)) if e.rv > last && matches(&e) => {
                        last = e.rv;
                        if tx.send(line(json!({"type": e.kind, "object": e.object}))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        let stream = futures::stream::unfold(body_rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap()
    }
}

/// JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}
