//! A fake Kubernetes API server for tests: real HTTP, one in-memory store, and the semantics of a
//! real API server for readers *and* writers, generically for every resource in [`RESOURCES`].
//!
//! # Paths
//!
//! `/api/v1/...` (core) and `/apis/GROUP/v1/...` for the groups `network.openshift.io`,
//! `networking.k8s.io`, `events.k8s.io` and `coordination.k8s.io`, cluster-scoped
//! (`RES`, `RES/NAME`) and namespaced (`namespaces/NS/RES`, `namespaces/NS/RES/NAME`, and
//! `RES` across all namespaces for list and watch), plus the `status` subresource
//! (`RES/NAME/status`, e.g. `/api/v1/nodes/NAME/status`) of the resources that have one (pods,
//! services, nodes, namespaces). An unknown resource, a resource under the wrong group, a
//! namespaced path of a cluster-scoped resource (or the reverse for one object) or a `status`
//! path of a resource without one answers 404 NotFound. Legacy discovery is served (`/api`,
//! `/api/v1`, `/apis`, `/apis/GROUP/v1`, `/version`; not the aggregated v2 form), so
//! `kube::Discovery::run` works.
//!
//! # Verbs (status codes as the real API server's, each error a `Status` with its `reason`)
//!
//! - **get** `RES/NAME` (and `RES/NAME/status`): 200, or 404 `NotFound` with the real message
//!   (`hostsubnets.network.openshift.io "x" not found`, `nodes "x" not found`) and details
//!   `{name, group, kind: RES}`.
//! - **list** `RES`: 200 `KindList` with `metadata.resourceVersion`; `fieldSelector` (`a.b=v`,
//!   `a.b==v`, `a.b!=v`, comma-separated), `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`,
//!   `k in (a,b)`, `k notin (a,b)`), `limit` with `metadata.continue` (the token is the last key
//!   returned; a later page shows the objects as they are then, with the first page's
//!   resourceVersion: a watch from it replays what changed in between). 403 when
//!   [`FakeKube::forbid`] / [`FakeKube::forbid_unselected`] say so.
//! - **watch** `RES?watch=true`: newline-delimited events. From `resourceVersion=N`: every
//!   event after N (the history is kept), 410 Gone (an `ERROR` event, reason `Expired`) when N
//!   is older than a compaction ([`FakeKube::delete_while_disconnected`]). Without a
//!   resourceVersion, or `0`, or with `sendInitialEvents=true`: a synthetic `ADDED` per current
//!   object first. A `BOOKMARK` after that backlog when `allowWatchBookmarks=true` (annotated
//!   `k8s.io/initial-events-end` with `sendInitialEvents=true`). Selectors apply to events as
//!   the real watch cache does: an object modified into the selection arrives as `ADDED`, out of
//!   it as `DELETED`. `timeoutSeconds` ends the response. A watcher that falls more than the
//!   broadcast buffer behind (4096 events, see [`FakeKube::start_with_watch_buffer`]) has its
//!   response ended, as the real server drops a slow watcher: the client rewatches from its
//!   last resourceVersion and the history serves what it missed ([`FakeKube::lagged_watches`]
//!   counts these).
//! - **create** `POST RES`: 201 with server-set `metadata.resourceVersion`, `uid` (unique),
//!   `creationTimestamp` (RFC 3339, seconds), `generation` 1; `generateName` gets a 5-character
//!   suffix; the URL's namespace fills an absent `metadata.namespace` (a different one is 400),
//!   a cluster-scoped object's is dropped. 409 `AlreadyExists` (`hostsubnets.network.openshift.io
//!   "x" already exists`); 422 `Invalid` without a name (`metadata.name: Required value: name or
//!   generateName is required`) or with a name that is not an RFC 1123 subdomain (label for
//!   namespaces, RFC 1035 label for services); 400 when `apiVersion`/`kind` in the body do not
//!   match the path. Status given on create is kept. Emits `ADDED`.
//! - **update** `PUT RES/NAME`: 200. 404 if absent (no create on update); 400 if the body's
//!   name or namespace differs from the URL's; 409 `Conflict` when the body's
//!   `metadata.resourceVersion` is set and is not the stored one ("Operation cannot be fulfilled
//!   on hostsubnets.network.openshift.io \"x\": the object has been modified; please apply your
//!   changes to the latest version and try again"), or its `metadata.uid` is set and differs
//!   ("... Precondition failed: UID in precondition: A, UID in object meta: B"). Keeps `uid`,
//!   `creationTimestamp`, `deletionTimestamp`, `generation` from the stored object; bumps the
//!   resourceVersion; bumps `generation` only if something outside `metadata` and `status`
//!   changed. For a resource with a status subresource, a PUT on the object keeps the stored
//!   `status` and a PUT on `/status` changes only `status`. An update that changes nothing is
//!   a no-op as on a real server: same resourceVersion, no event. Emits `MODIFIED`.
//! - **patch** `PATCH RES/NAME` (and `/status`, which touches `status` only), by content type:
//!   - `application/merge-patch+json`: RFC 7386.
//!   - `application/json-patch+json`: RFC 6902 (`add`, `remove`, `replace`, `move`, `copy`,
//!     `test`); a failed `test` or a path that does not resolve is 422 `Invalid` and nothing
//!     changes; a body that is not an array of operations is 400.
//!   - `application/strategic-merge-patch+json`: a merge patch whose lists of objects merge by
//!     their patch merge key — `conditions` and `addresses` by `type`; `containers`,
//!     `initContainers`, `ephemeralContainers`, `env`, `volumes`, `imagePullSecrets`,
//!     `resourceClaims`, `schedulingGates` by `name`; `ports` by `containerPort` in a container
//!     and by `port` directly under `spec` (services); `volumeMounts` by `mountPath`;
//!     `volumeDevices` by `devicePath`; `ownerReferences` by `uid`; `podIPs`, `hostIPs`,
//!     `hostAliases` by `ip` — and `metadata.finalizers` merges as a set. Every other list is
//!     replaced. Directives: `$patch: delete` (list element or map), `$patch: replace`,
//!     `$deleteFromPrimitiveList/F`, `$setElementOrder/F`, `$retainKeys`. A list element
//!     without its merge key is 400. Refused with 415 on the `network.openshift.io` resources,
//!     which are custom resources in OpenShift 4 (a real server refuses strategic merge on
//!     those).
//!   - `application/apply-patch+yaml` (server-side apply): the body is JSON or YAML and must
//!     carry `apiVersion` and `kind` (400 otherwise); the `fieldManager` query parameter is
//!     required (422 `Invalid` without it, as the real server); `force=true` is accepted. An
//!     absent object is created (201); an existing one is merged as by a strategic merge patch
//!     (200). Not modelled: `managedFields`, field ownership and conflicts between managers
//!     (an apply never gets 409 for another manager's fields), and removal of fields a manager
//!     stops applying.
//!   - anything else: 415 `UnsupportedMediaType`.
//!
//!   A patched object whose `metadata.resourceVersion` (or `uid`) is set and differs from the
//!   stored one is 409 `Conflict`, as the real server treats it as a precondition. 404 if
//!   absent (except apply). No-op patches do not bump the resourceVersion.
//! - **delete** `DELETE RES/NAME`: 200 with the deleted object (its final resourceVersion);
//!   404 if absent; `DeleteOptions.preconditions.resourceVersion` / `.uid` in the JSON body are
//!   honoured (409 `Conflict` on a mismatch). An object with `metadata.finalizers` is not
//!   removed: it gets `deletionTimestamp` (202 Accepted, `MODIFIED`) and goes (`DELETED`) when
//!   an update or patch empties its finalizers. Emits `DELETED`. No garbage collection:
//!   ownerReferences and `propagationPolicy` are ignored, a deleted namespace goes at once with
//!   nothing in it deleted. **deletecollection** `DELETE RES` (selectors apply): 200 with the
//!   list of what went.
//! - `dryRun=All` (query, or `dryRun: ["All"]` in DeleteOptions) answers as the write would
//!   and stores nothing.
//!
//! The store is one map per resource plural. Events of `events.k8s.io/v1` and core `v1` are the
//! one `events` store; an object keeps the apiVersion it was written with. Namespaces need not
//! exist for objects in them. `resourceVersion` on get and list is ignored (always the latest).
//!
//! # Test helpers
//!
//! Seeding and reading, bypassing HTTP: [`FakeKube::put`] (create or replace as given:
//! apiVersion/kind set, a uid and creationTimestamp added if absent, always an event),
//! [`FakeKube::put_many`], [`FakeKube::delete`], [`FakeKube::object`], [`FakeKube::objects`].
//! Failures: [`FakeKube::forbid`], [`FakeKube::forbid_unselected`], [`FakeKube::drop_watches`],
//! [`FakeKube::delete_while_disconnected`], [`FakeKube::fail_next`], [`FakeKube::delay`].
//! Records: [`FakeKube::requests`], [`FakeKube::count`], [`FakeKube::posts`],
//! [`FakeKube::patches`], [`FakeKube::lagged_watches`].
//!
//! `method` in [`FakeKube::fail_next`] and [`FakeKube::count`] is either an HTTP method in
//! capitals (`"GET"`, `"POST"`, `"PUT"`, `"PATCH"`, `"DELETE"`; `"GET"` covers get, list and
//! watch) or a Kubernetes verb in lower case (`"get"`, `"list"`, `"watch"`, `"create"`,
//! `"update"`, `"patch"`, `"delete"`, `"deletecollection"`); anything else panics. `resource`
//! is a plural (`"nodes"`: the object and its subresources), `"nodes/status"` (the subresource
//! only) or `"*"`. Unknown resources panic in every helper but [`FakeKube::object`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// One resource the fake serves.
pub struct Res {
    pub plural: &'static str,
    /// API groups it is served under ("" is core); the first is the one [`FakeKube::put`] uses.
    pub groups: &'static [&'static str],
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `status` subresource.
    pub status: bool,
    /// A custom resource (no strategic merge patch).
    pub custom: bool,
}

const fn res(plural: &'static str, groups: &'static [&'static str], kind: &'static str, namespaced: bool) -> Res {
    Res { plural, groups, kind, namespaced, status: false, custom: false }
}

const fn with_status(r: Res) -> Res {
    Res { status: true, ..r }
}

const fn custom(r: Res) -> Res {
    Res { custom: true, ..r }
}

/// The resources the fake serves.
pub const RESOURCES: &[Res] = &[
    with_status(res("pods", &[""], "Pod", true)),
    with_status(res("services", &[""], "Service", true)),
    with_status(res("nodes", &[""], "Node", false)),
    with_status(res("namespaces", &[""], "Namespace", false)),
    res("endpoints", &[""], "Endpoints", true),
    res("configmaps", &[""], "ConfigMap", true),
    res("secrets", &[""], "Secret", true),
    res("serviceaccounts", &[""], "ServiceAccount", true),
    res("events", &["events.k8s.io", ""], "Event", true),
    res("networkpolicies", &["networking.k8s.io"], "NetworkPolicy", true),
    res("leases", &["coordination.k8s.io"], "Lease", true),
    custom(res("clusternetworks", &["network.openshift.io"], "ClusterNetwork", false)),
    custom(res("hostsubnets", &["network.openshift.io"], "HostSubnet", false)),
    custom(res("netnamespaces", &["network.openshift.io"], "NetNamespace", false)),
    custom(res("egressnetworkpolicies", &["network.openshift.io"], "EgressNetworkPolicy", true)),
];

fn res_info(plural: &str) -> Option<&'static Res> {
    RESOURCES.iter().find(|r| r.plural == plural)
}

fn known(plural: &str) -> &'static Res {
    res_info(plural).unwrap_or_else(|| panic!("the fake Kubernetes API serves no resource {plural:?}"))
}

fn group_version(group: &str) -> String {
    if group.is_empty() {
        "v1".into()
    } else {
        format!("{group}/v1")
    }
}

/// (namespace or "", name).
type Key = (String, String);

struct Ev {
    rv: u64,
    resource: &'static str,
    kind: &'static str,
    object: Value,
    /// The object before a MODIFIED (for selectors).
    prev: Option<Value>,
    /// The event line, serialized once.
    line: Bytes,
}

#[derive(Clone)]
enum Msg {
    Ev(Arc<Ev>),
    /// End the open watches of a resource.
    Cut(String),
}

/// One request, for [`FakeKube::count`] and [`FakeKube::fail_next`].
struct Call {
    method: String,
    verb: &'static str,
    resource: &'static str,
    status: bool,
}

struct Failure {
    method: String,
    resource: String,
    left: usize,
    code: u16,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    seed: u64,
    uids: u64,
    objects: BTreeMap<&'static str, BTreeMap<Key, Value>>,
    /// The events of each resource, in resourceVersion order.
    log: BTreeMap<&'static str, Vec<Arc<Ev>>>,
    /// Watches of this resource from an older resourceVersion get 410 Gone.
    compacted: BTreeMap<String, u64>,
    /// Listing (and watching) this resource answers 403.
    forbidden: BTreeSet<String>,
    /// Listing (and watching) this resource without a field selector answers 403.
    forbidden_unselected: BTreeSet<String>,
    posts: Vec<(String, Value)>,
    patches: Vec<(String, String, Value)>,
    requests: Vec<String>,
    calls: Vec<Call>,
    failures: Vec<Failure>,
    delays: BTreeMap<String, Duration>,
    lagged: usize,
}

#[derive(Clone)]
pub struct FakeKube {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<Msg>,
    pub addr: SocketAddr,
}

/// An error answer: (HTTP code, Status).
type Reply = (u16, Value);

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn status_with(code: u16, reason: &str, message: &str, details: Value) -> Value {
    let mut s = status(code, reason, message);
    s["details"] = details;
    s
}

fn bad_request(message: &str) -> Reply {
    (400, status(400, "BadRequest", message))
}

fn respond(code: u16, body: &Value) -> Response {
    respond_text(code, body.to_string())
}

fn respond_text(code: u16, body: String) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}

fn reply(r: Reply) -> Response {
    respond(r.0, &r.1)
}

fn not_found_path() -> Response {
    respond(404, &status_with(404, "NotFound", "the server could not find the requested resource", json!({})))
}

const MODIFIED: &str = "the object has been modified; please apply your changes to the latest version and try again";

const PATCH_TYPES: &str = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";

/// What a request is about.
struct Target {
    res: &'static Res,
    /// The path's group.
    group: &'static str,
    ns: Option<String>,
    name: Option<String>,
    /// The `status` subresource.
    status: bool,
}

impl Target {
    fn gv(&self) -> String {
        group_version(self.group)
    }

    /// `hostsubnets.network.openshift.io`, `nodes`.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.res.plural.to_string()
        } else {
            format!("{}.{}", self.res.plural, self.group)
        }
    }

    fn details(&self, name: &str, kind: &str) -> Value {
        let mut d = json!({"name": name, "kind": kind});
        if !self.group.is_empty() {
            d["group"] = json!(self.group);
        }
        d
    }

    fn not_found(&self, name: &str) -> Reply {
        let msg = format!("{} \"{name}\" not found", self.qualified());
        (404, status_with(404, "NotFound", &msg, self.details(name, self.res.plural)))
    }

    fn already_exists(&self, name: &str) -> Reply {
        let msg = format!("{} \"{name}\" already exists", self.qualified());
        (409, status_with(409, "AlreadyExists", &msg, self.details(name, self.res.plural)))
    }

    fn conflict(&self, name: &str, why: &str) -> Reply {
        let msg = format!("Operation cannot be fulfilled on {} \"{name}\": {why}", self.qualified());
        (409, status_with(409, "Conflict", &msg, self.details(name, self.res.plural)))
    }

    /// 422 Invalid, one cause.
    fn invalid(&self, name: &str, field: &str, cause: &str, detail: &str) -> Reply {
        let kind =
            if self.group.is_empty() { self.res.kind.to_string() } else { format!("{}.{}", self.res.kind, self.group) };
        let msg = format!("{kind} \"{name}\" is invalid: {field}: {detail}");
        let mut details = self.details(name, self.res.kind);
        details["causes"] = json!([{"reason": cause, "message": detail, "field": field}]);
        (422, status_with(422, "Invalid", &msg, details))
    }

    fn ns_key(&self) -> String {
        self.ns.clone().unwrap_or_default()
    }
}

/// The target of an API path (`None`: a path the fake does not serve, 404).
fn target(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest): (&str, &[&str]) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (group, rest),
        _ => return None,
    };
    match rest {
        ["namespaces", ns, res, rest @ ..] if *res != "status" && *res != "finalize" => {
            let mut r = vec![*res];
            r.extend_from_slice(rest);
            target_in(group, Some(ns.to_string()), &r)
        }
        _ => target_in(group, None, rest),
    }
}

fn target_in(group: &str, ns: Option<String>, rest: &[&str]) -> Option<Target> {
    let (plural, name, sub) = match rest {
        [res] => (*res, None, None),
        [res, name] => (*res, Some(name.to_string()), None),
        [res, name, sub] => (*res, Some(name.to_string()), Some(*sub)),
        _ => return None,
    };
    let res = res_info(plural)?;
    let group = res.groups.iter().find(|g| **g == group)?;
    if ns.is_some() && !res.namespaced || name.as_ref().is_some_and(|n| n.is_empty()) {
        return None;
    }
    if res.namespaced && ns.is_none() && name.is_some() {
        return None;
    }
    let status = match sub {
        None => false,
        Some("status") if res.status => true,
        Some(_) => return None,
    };
    Some(Target { res, group, ns, name, status })
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%')
            .then(|| b.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 2;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .map(|(k, v)| (pct_decode(k), pct_decode(v)))
        .collect()
}

fn truthy(v: Option<&String>) -> bool {
    v.is_some_and(|v| v == "true" || v == "1")
}

/// The string a field selector compares (a missing field is "").
fn field_text(obj: &Value, path: &str) -> String {
    let mut v = obj;
    for part in path.split('.') {
        v = &v[part];
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `a.b.c=v`, `a.b.c==v`, `a.b.c!=v` field selectors, comma-separated.
fn selected(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else { return true };
    sel.split(',').all(|term| {
        if let Some((path, want)) = term.split_once("!=") {
            field_text(obj, path.trim()) != want.trim()
        } else if let Some((path, want)) = term.split_once('=') {
            field_text(obj, path.trim()) == want.trim_start_matches('=').trim()
        } else {
            true
        }
    })
}

#[derive(Clone, Debug)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

fn parse_labels(sel: &str) -> Result<Vec<LabelReq>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in sel.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&sel[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&sel[start..]);
    let set = |s: &str| -> Result<Vec<String>, String> {
        let s = s.trim();
        let inner = s
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or(format!("unable to parse requirement: {sel}"))?;
        Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
    };
    let mut reqs = Vec::new();
    for term in terms.into_iter().map(str::trim).filter(|t| !t.is_empty()) {
        let req = if let Some((k, v)) = term.split_once(" notin ") {
            LabelReq::NotIn(k.trim().into(), set(v)?)
        } else if let Some((k, v)) = term.split_once(" in ") {
            LabelReq::In(k.trim().into(), set(v)?)
        } else if let Some(k) = term.strip_prefix('!') {
            LabelReq::NotExists(k.trim().into())
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelReq::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once("==") {
            LabelReq::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once('=') {
            LabelReq::Eq(k.trim().into(), v.trim().into())
        } else if term.contains([' ', '(', ')']) {
            return Err(format!("unable to parse requirement: {term}"));
        } else {
            LabelReq::Exists(term.into())
        };
        reqs.push(req);
    }
    Ok(reqs)
}

/// What a list or watch selects.
#[derive(Clone, Default)]
struct Filter {
    ns: Option<String>,
    fields: Option<String>,
    labels: Vec<LabelReq>,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.ns {
            if obj["metadata"]["namespace"].as_str() != Some(ns) {
                return false;
            }
        }
        if !selected(obj, self.fields.as_deref()) {
            return false;
        }
        let labels = &obj["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.labels.iter().all(|r| match r {
            LabelReq::Eq(k, v) => label(k) == Some(v),
            LabelReq::Ne(k, v) => label(k) != Some(v),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        })
    }
}

fn event_line(kind: &str, obj: &Value) -> Bytes {
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{obj}}}\n"))
}

/// The line a watcher with `filter` gets for `ev`, if any.
fn render(ev: &Ev, filter: &Filter) -> Option<Bytes> {
    let now = filter.matches(&ev.object);
    match &ev.prev {
        Some(prev) if ev.kind == "MODIFIED" => match (filter.matches(prev), now) {
            (true, true) => Some(ev.line.clone()),
            (false, true) => Some(event_line("ADDED", &ev.object)),
            (true, false) => Some(event_line("DELETED", &ev.object)),
            (false, false) => None,
        },
        _ => now.then(|| ev.line.clone()),
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn now_rfc3339() -> String {
    let s = jiff::Timestamp::now().as_second();
    jiff::Timestamp::from_second(s).unwrap().to_string()
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Why `name` is not a valid name for `res`, as the real server says it.
fn name_problem(res: &Res, name: &str) -> Option<String> {
    match res.plural {
        "namespaces" => (!is_label(name) || name.len() > 63).then(|| {
            format!("Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
        }),
        "services" => (!is_label(name) || name.len() > 63 || !name.as_bytes()[0].is_ascii_lowercase()).then(|| {
            format!("Invalid value: \"{name}\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
        }),
        _ => (name.len() > 253 || !name.split('.').all(is_label)).then(|| {
            format!("Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
        }),
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

fn key_of(obj: &Value) -> Key {
    (meta_str(obj, "namespace").to_string(), meta_str(obj, "name").to_string())
}

/// Sets `obj[k]` to `v`, or removes it for `None`.
fn set_or_remove(obj: &mut Value, k: &str, v: Option<Value>) {
    if !obj.is_object() {
        *obj = json!({});
    }
    let m = obj.as_object_mut().unwrap();
    match v {
        Some(v) => {
            m.insert(k.to_string(), v);
        }
        None => {
            m.remove(k);
        }
    }
}

/// Whether `a` and `b` are the same outside `metadata` and `status` (and the type fields).
fn same_outside_meta(a: &Value, b: &Value) -> bool {
    let skip = |k: &String| !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind");
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return a == b };
    a.iter().filter(|(k, _)| skip(k)).count() == b.iter().filter(|(k, _)| skip(k)).count()
        && a.iter().filter(|(k, _)| skip(k)).all(|(k, v)| b.get(k) == Some(v))
}

fn is_deleted_on_update(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
        && obj["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty())
}

impl FakeKube {
    pub async fn start() -> FakeKube {
        Self::start_with_watch_buffer(4096).await
    }

    /// A fake whose watch broadcast holds `events` events: a watcher further behind has its
    /// response ended (see the module doc). Small values test clients' rewatching.
    pub async fn start_with_watch_buffer(events: usize) -> FakeKube {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, _) = broadcast::channel(events);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let seed = splitmix(nanos ^ (u64::from(addr.port()) << 48));
        let inner = Inner { rv: 100, seed, ..Default::default() };
        let fake = FakeKube { inner: Arc::new(Mutex::new(inner)), events: tx, addr };
        fake.serve(listener);
        fake
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let f = self.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let f = f.clone();
            async move { f.handle(method, uri, headers, body).await }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
    }

    /// Serves the same objects on `listener` too (e.g. one bound inside another network
    /// namespace, for processes there); returns its address.
    pub async fn serve_also(&self, listener: std::net::TcpListener) -> SocketAddr {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let addr = listener.local_addr().unwrap();
        self.serve(listener);
        addr
    }

    /// A kubeconfig (no auth) pointing at this server.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        self.kubeconfig_for(dir, "kubeconfig", self.addr)
    }

    /// A kubeconfig file `dir/name` pointing at `addr` (one of [`FakeKube::serve_also`]'s).
    pub fn kubeconfig_for(&self, dir: &std::path::Path, name: &str, addr: SocketAddr) -> std::path::PathBuf {
        let path = dir.join(name);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: u\ncurrent-context: fake\n",
            addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_uid(g: &mut Inner) -> String {
        g.uids += 1;
        let x = splitmix(g.seed ^ g.uids);
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            x >> 32,
            (x >> 16) & 0xffff,
            x & 0xfff,
            0x8000 | (x >> 52),
            g.uids
        )
    }

    /// Stores (or, `deleted`, has removed) `obj` at a new resourceVersion and tells the
    /// watches. Returns the object as stored.
    fn commit(&self, g: &mut Inner, res: &'static Res, mut obj: Value, prev: Option<Value>, deleted: bool) -> Value {
        g.rv += 1;
        let rv = g.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let kind = if deleted {
            "DELETED"
        } else if prev.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if !deleted {
            g.objects.entry(res.plural).or_default().insert(key_of(&obj), obj.clone());
        }
        let line = event_line(kind, &obj);
        let prev = if kind == "MODIFIED" { prev } else { None };
        let ev = Arc::new(Ev { rv, resource: res.plural, kind, object: obj.clone(), prev, line });
        g.log.entry(res.plural).or_default().push(ev.clone());
        let _ = self.events.send(Msg::Ev(ev));
        obj
    }

    fn put_locked(&self, g: &mut Inner, resource: &str, mut obj: Value) {
        let res = known(resource);
        obj["apiVersion"] = json!(group_version(res.groups[0]));
        obj["kind"] = json!(res.kind);
        let key = key_of(&obj);
        let prev = g.objects.get_mut(res.plural).and_then(|m| m.remove(&key));
        for field in ["uid", "creationTimestamp"] {
            if obj["metadata"][field].is_null() {
                let v = match &prev {
                    Some(p) if !p["metadata"][field].is_null() => p["metadata"][field].clone(),
                    _ if field == "uid" => json!(Self::new_uid(g)),
                    _ => json!(now_rfc3339()),
                };
                obj["metadata"][field] = v;
            }
        }
        self.commit(g, res, obj, prev, false);
    }

    /// Creates or replaces an object as given (ADDED or MODIFIED), bypassing the API's checks:
    /// apiVersion and kind are set, a uid and creationTimestamp added if absent (kept from the
    /// stored object on a replace), the resourceVersion bumped.
    pub fn put(&self, resource: &str, obj: Value) {
        let mut g = self.lock();
        self.put_locked(&mut g, resource, obj);
    }

    /// [`FakeKube::put`] of many objects under one lock (seeding thousands quickly).
    pub fn put_many(&self, resource: &str, objs: Vec<Value>) {
        let mut g = self.lock();
        for obj in objs {
            self.put_locked(&mut g, resource, obj);
        }
    }

    /// Deletes an object (DELETED), ignoring finalizers; panics if it is absent.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) {
        let res = known(resource);
        let mut g = self.lock();
        let key = (namespace.to_string(), name.to_string());
        let Some(obj) = g.objects.get_mut(res.plural).and_then(|m| m.remove(&key)) else {
            panic!("no {resource} {namespace}/{name}")
        };
        self.commit(&mut g, res, obj, None, true);
    }

    /// Deletes an object while the resource's watches are gone: the open watches are cut and
    /// the history is compacted, so the watcher's next watch gets 410 Gone and must relist.
    pub fn delete_while_disconnected(&self, resource: &str, namespace: &str, name: &str) {
        let res = known(resource);
        let mut g = self.lock();
        let key = (namespace.to_string(), name.to_string());
        g.objects.get_mut(res.plural).and_then(|m| m.remove(&key)).expect("object to delete");
        g.rv += 1;
        let rv = g.rv;
        g.compacted.insert(resource.into(), rv);
        let _ = self.events.send(Msg::Cut(resource.into()));
    }

    /// Ends the open watches of a resource (the connection drops; history is kept).
    pub fn drop_watches(&self, resource: &str) {
        let _g = self.lock();
        let _ = self.events.send(Msg::Cut(resource.into()));
    }

    pub fn forbid(&self, resource: &str, forbidden: bool) {
        let mut g = self.lock();
        if forbidden {
            g.forbidden.insert(resource.into());
        } else {
            g.forbidden.remove(resource);
        }
    }

    /// Lists and watches of `resource` without a field selector answer 403 (a node allowed to
    /// see only its own pods).
    pub fn forbid_unselected(&self, resource: &str, forbidden: bool) {
        let mut g = self.lock();
        if forbidden {
            g.forbidden_unselected.insert(resource.into());
        } else {
            g.forbidden_unselected.remove(resource);
        }
    }

    /// The next `n` requests of `method` on `resource` (see the module doc for both) answer
    /// `code` with a Status (reason from the code: 500 InternalError, 429 TooManyRequests and
    /// 503 ServiceUnavailable with `Retry-After: 1`, 409 Conflict, ...) and change nothing.
    /// kube's client retries 429, 503 and 504 by itself.
    pub fn fail_next(&self, method: &str, resource: &str, n: usize, code: u16) {
        check_spec(method, resource);
        self.lock().failures.push(Failure { method: method.into(), resource: resource.into(), left: n, code });
    }

    /// Every request on `resource` (`"nodes"`: the object and its subresources, `"nodes/status"`,
    /// or `"*"`) waits `by` before it is served (a watch: before its response starts).
    /// `Duration::ZERO` ends the delay.
    pub fn delay(&self, resource: &str, by: Duration) {
        check_spec("GET", resource);
        let mut g = self.lock();
        if by.is_zero() {
            g.delays.remove(resource);
        } else {
            g.delays.insert(resource.into(), by);
        }
    }

    /// How many requests of `method` `resource` got so far (see the module doc), failed ones
    /// included.
    pub fn count(&self, method: &str, resource: &str) -> usize {
        check_spec(method, resource);
        self.lock().calls.iter().filter(|c| call_matches(method, resource, c)).count()
    }

    /// How many watch responses were ended because their watcher fell behind the broadcast.
    pub fn lagged_watches(&self) -> usize {
        self.lock().lagged
    }

    /// The POST requests: (path, body as sent).
    pub fn posts(&self) -> Vec<(String, Value)> {
        self.lock().posts.clone()
    }

    /// The PATCH requests of every resource: (path, content type, body; an apply's YAML as
    /// JSON, a body that does not parse as a string).
    pub fn patches(&self) -> Vec<(String, String, Value)> {
        self.lock().patches.clone()
    }

    /// The requests so far (method and path with query).
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let g = self.lock();
        g.objects.get(resource)?.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    /// Every stored object of `resource`, by namespace and name.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let res = known(resource);
        self.lock().objects.get(res.plural).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    async fn handle(self, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        self.lock().requests.push(format!("{method} {uri}"));
        let path = uri.path().to_string();
        if method == Method::GET {
            if let Some(r) = self.discovery(&path) {
                return r;
            }
        }
        let Some(t) = target(&path) else { return not_found_path() };
        let q = query(&uri);
        let verb = match (&method, &t.name) {
            (&Method::GET, Some(_)) => "get",
            (&Method::GET, None) if truthy(q.get("watch")) => "watch",
            (&Method::GET, None) => "list",
            (&Method::POST, None) => "create",
            (&Method::PUT, Some(_)) => "update",
            (&Method::PATCH, Some(_)) => "patch",
            (&Method::DELETE, Some(_)) => "delete",
            (&Method::DELETE, None) => "deletecollection",
            _ => {
                let msg = "the server does not allow this method on the requested resource";
                return respond(405, &status(405, "MethodNotAllowed", msg));
            }
        };
        let (injected, delay) = {
            let mut g = self.lock();
            let call = Call { method: method.to_string(), verb, resource: t.res.plural, status: t.status };
            let injected =
                g.failures.iter_mut().find(|f| f.left > 0 && call_matches(&f.method, &f.resource, &call)).map(|f| {
                    f.left -= 1;
                    f.code
                });
            g.failures.retain(|f| f.left > 0);
            g.calls.push(call);
            let sub = format!("{}/status", t.res.plural);
            let delay = (t.status.then(|| g.delays.get(&sub)).flatten())
                .or_else(|| g.delays.get(t.res.plural))
                .or_else(|| g.delays.get("*"))
                .copied();
            let parsed =
                || serde_json::from_slice::<Value>(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)));
            if verb == "create" {
                g.posts.push((path.clone(), parsed()));
            }
            if verb == "patch" {
                let ct = content_type(&headers);
                let v = if ct == "application/apply-patch+yaml" {
                    parse_apply(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)))
                } else {
                    parsed()
                };
                g.patches.push((path.clone(), ct, v));
            }
            (injected, delay)
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        if let Some(code) = injected {
            return injected_response(code);
        }
        let r = match verb {
            "get" => self.get(&t),
            "list" | "watch" => return self.list(&t, &q),
            "create" => self.create(&t, &q, &body),
            "update" => self.update(&t, &q, &body),
            "patch" => self.patch(&t, &q, &headers, &body),
            "delete" => self.delete_one(&t, &q, &body),
            _ => self.delete_collection(&t, &q, &body),
        };
        match r {
            Ok((code, v)) | Err((code, v)) => respond(code, &v),
        }
    }

    fn discovery(&self, path: &str) -> Option<Response> {
        let path = path.trim_end_matches('/');
        let groups: BTreeSet<&str> =
            RESOURCES.iter().flat_map(|r| r.groups.iter().copied()).filter(|g| !g.is_empty()).collect();
        let resources = |group: &str| {
            let mut list = Vec::new();
            for r in RESOURCES.iter().filter(|r| r.groups.contains(&group)) {
                let verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
                list.push(json!({"name": r.plural, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs}));
                if r.status {
                    list.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
                }
            }
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version(group), "resources": list})
        };
        let body = match path {
            "/version" => json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}),
            "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.addr.to_string()}]}),
            "/apis" => {
                let list: Vec<Value> = groups
                    .iter()
                    .map(|g| {
                        let v = json!({"groupVersion": group_version(g), "version": "v1"});
                        json!({"name": g, "versions": [v.clone()], "preferredVersion": v})
                    })
                    .collect();
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": list})
            }
            "/api/v1" => resources(""),
            _ => match path.strip_prefix("/apis/").and_then(|p| p.strip_suffix("/v1")) {
                Some(g) if groups.contains(g) => resources(g),
                _ => return None,
            },
        };
        Some(respond(200, &body))
    }

    fn get(&self, t: &Target) -> Result<Reply, Reply> {
        let name = t.name.as_deref().unwrap();
        let g = self.lock();
        match g.objects.get(t.res.plural).and_then(|m| m.get(&(t.ns_key(), name.to_string()))) {
            Some(o) => Ok((200, o.clone())),
            None => Err(t.not_found(name)),
        }
    }

    fn filter(t: &Target, q: &BTreeMap<String, String>) -> Result<Filter, Reply> {
        let labels = match q.get("labelSelector") {
            Some(s) => parse_labels(s).map_err(|e| bad_request(&e))?,
            None => Vec::new(),
        };
        Ok(Filter { ns: t.ns.clone(), fields: q.get("fieldSelector").cloned(), labels })
    }

    fn list(&self, t: &Target, q: &BTreeMap<String, String>) -> Response {
        let res = t.res.plural;
        {
            let g = self.lock();
            let unselected = !q.contains_key("fieldSelector") && g.forbidden_unselected.contains(res);
            if unselected || g.forbidden.contains(res) {
                let msg = format!("{res} is forbidden: User \"system:node\" cannot list resource \"{res}\"");
                return respond(403, &status(403, "Forbidden", &msg));
            }
        }
        let filter = match Self::filter(t, q) {
            Ok(f) => f,
            Err(r) => return reply(r),
        };
        if truthy(q.get("watch")) {
            return self.watch(t, q, filter);
        }
        let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
        let after = match q.get("continue").filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => {
                let mut parts = c.splitn(3, '|');
                match (parts.next().and_then(|rv| rv.parse::<u64>().ok()), parts.next(), parts.next()) {
                    (Some(rv), Some(ns), Some(name)) => Some((rv, (ns.to_string(), name.to_string()))),
                    _ => return reply(bad_request("invalid continue token")),
                }
            }
        };
        let g = self.lock();
        let rv = after.as_ref().map_or(g.rv, |a| a.0);
        let empty = BTreeMap::new();
        let objects = g.objects.get(res).unwrap_or(&empty);
        let lower = match (&after, &t.ns) {
            (Some((_, key)), _) => Bound::Excluded(key.clone()),
            (None, Some(ns)) => Bound::Included((ns.clone(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut items = String::new();
        let (mut n, mut next) = (0, None);
        let mut last: Option<&Key> = None;
        for (key, o) in objects.range((lower, Bound::Unbounded)) {
            if t.ns.as_ref().is_some_and(|ns| &key.0 != ns) {
                if t.ns.as_ref().is_some_and(|ns| &key.0 > ns) {
                    break;
                }
                continue;
            }
            if !filter.matches(o) {
                continue;
            }
            if limit.is_some_and(|l| n == l) {
                let (ns, name) = last.unwrap();
                next = Some(format!("{rv}|{ns}|{name}"));
                break;
            }
            if n > 0 {
                items.push(',');
            }
            items.push_str(&o.to_string());
            n += 1;
            last = Some(key);
        }
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(c) = next {
            meta["continue"] = json!(c);
        }
        let body = format!(
            "{{\"apiVersion\":\"{}\",\"kind\":\"{}List\",\"metadata\":{meta},\"items\":[{items}]}}",
            t.gv(),
            t.res.kind
        );
        respond_text(200, body)
    }

    fn watch(&self, t: &Target, q: &BTreeMap<String, String>, filter: Filter) -> Response {
        let res = t.res.plural;
        let from = q.get("resourceVersion").and_then(|v| v.parse::<u64>().ok()).filter(|v| *v > 0);
        let initial_events = truthy(q.get("sendInitialEvents"));
        let from = if initial_events { None } else { from };
        let bookmarks = truthy(q.get("allowWatchBookmarks"));
        let timeout = q.get("timeoutSeconds").and_then(|v| v.parse::<u64>().ok()).filter(|v| *v > 0);
        let mut rx = self.events.subscribe();
        let (initial, backlog, gone, now) = {
            let g = self.lock();
            let (mut initial, mut backlog, mut gone) = (Vec::new(), Vec::new(), false);
            match from {
                None => {
                    if let Some(m) = g.objects.get(res) {
                        initial = m.values().filter(|o| filter.matches(o)).map(|o| event_line("ADDED", o)).collect();
                    }
                }
                Some(from) => {
                    gone = g.compacted.get(res).is_some_and(|c| from < *c);
                    if let Some(log) = g.log.get(res) {
                        let start = log.partition_point(|e| e.rv <= from);
                        backlog = log[start..].to_vec();
                    }
                }
            }
            (initial, backlog, gone, g.rv.max(from.unwrap_or(0)))
        };
        let inner = self.inner.clone();
        let (kind, api_version) = (t.res.kind, t.gv());
        let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
        tokio::spawn(async move {
            if gone {
                let e = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")});
                let _ = tx.send(Ok(Bytes::from(format!("{e}\n")))).await;
                return;
            }
            let lines = initial.into_iter().chain(backlog.iter().filter_map(|e| render(e, &filter)));
            for line in lines {
                if tx.send(Ok(line)).await.is_err() {
                    return;
                }
            }
            if bookmarks {
                let mut b = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                    "metadata": {"resourceVersion": now.to_string()}}});
                if initial_events {
                    b["object"]["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                }
                if tx.send(Ok(Bytes::from(format!("{b}\n")))).await.is_err() {
                    return;
                }
            }
            let deadline = timeout.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
            loop {
                let ended = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                };
                let msg = tokio::select! {
                    _ = tx.closed() => return,
                    _ = ended => return,
                    m = rx.recv() => m,
                };
                match msg {
                    Ok(Msg::Ev(ev)) if ev.resource == res && ev.rv > now => {
                        if let Some(line) = render(&ev, &filter) {
                            if tx.send(Ok(line)).await.is_err() {
                                return;
                            }
                        }
                    }
                    // The connection drops (the body ends).
                    Ok(Msg::Cut(r)) if r == res => return,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // Too slow: the response ends, the client rewatches from its last
                        // resourceVersion and the history serves the rest.
                        inner.lock().unwrap_or_else(|e| e.into_inner()).lagged += 1;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
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

    /// 400 when the body's apiVersion or kind (if set, or always for `required`) is not the
    /// path's.
    fn check_types(t: &Target, obj: &Value, required: bool) -> Result<(), Reply> {
        let (gv, kind) = (t.gv(), t.res.kind);
        match obj["apiVersion"].as_str() {
            None if required => return Err(bad_request("invalid object: apiVersion must be set")),
            Some(v) if v != gv => {
                return Err(bad_request(&format!(
                    "the API version in the data ({v}) does not match the expected API version ({gv})"
                )));
            }
            _ => {}
        }
        match obj["kind"].as_str() {
            None if required => Err(bad_request(&format!("Object 'Kind' is missing in '{obj}'"))),
            Some(k) if k != kind => {
                Err(bad_request(&format!("the kind in the data ({k}) does not match the expected kind ({kind})")))
            }
            _ => Ok(()),
        }
    }

    /// The object a create stores (without its resourceVersion), or why not.
    fn prepare_create(
        g: &mut Inner,
        t: &Target,
        mut obj: Value,
        url_name: Option<&str>,
        apply: bool,
    ) -> Result<Value, Reply> {
        if !obj.is_object() {
            return Err(bad_request("the body of the request is not an object"));
        }
        Self::check_types(t, &obj, apply)?;
        obj["apiVersion"] = json!(t.gv());
        obj["kind"] = json!(t.res.kind);
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        if t.res.namespaced {
            let ns = t.ns_key();
            match obj["metadata"]["namespace"].as_str() {
                None | Some("") => obj["metadata"]["namespace"] = json!(ns),
                Some(n) if n != ns => {
                    return Err(bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {}
            }
        } else {
            obj["metadata"].as_object_mut().unwrap().remove("namespace");
        }
        if let Some(url) = url_name {
            match meta_str(&obj, "name") {
                "" => obj["metadata"]["name"] = json!(url),
                n if n != url => {
                    return Err(bad_request(&format!(
                        "the name of the object ({n}) does not match the name on the URL ({url})"
                    )));
                }
                _ => {}
            }
        }
        let ns = t.ns_key();
        let exists = |g: &Inner, name: &str| {
            g.objects.get(t.res.plural).is_some_and(|m| m.contains_key(&(ns.clone(), name.to_string())))
        };
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                let detail = "Required value: name or generateName is required";
                return Err(t.invalid("", "metadata.name", "FieldValueRequired", detail));
            }
            loop {
                g.uids += 1;
                let mut x = splitmix(g.seed ^ g.uids.rotate_left(32));
                let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
                let suffix: String = (0..5)
                    .map(|_| {
                        let c = alphabet[(x % alphabet.len() as u64) as usize] as char;
                        x /= alphabet.len() as u64;
                        c
                    })
                    .collect();
                name = format!("{prefix}{suffix}");
                if !exists(g, &name) {
                    break;
                }
            }
            obj["metadata"]["name"] = json!(name);
        }
        if let Some(problem) = name_problem(t.res, &name) {
            return Err(t.invalid(&name, "metadata.name", "FieldValueInvalid", &problem));
        }
        if exists(g, &name) {
            return Err(t.already_exists(&name));
        }
        let m = obj["metadata"].as_object_mut().unwrap();
        for f in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"] {
            m.remove(f);
        }
        m.insert("uid".into(), json!(Self::new_uid(g)));
        m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        m.insert("generation".into(), json!(1));
        Ok(obj)
    }

    fn create(&self, t: &Target, q: &BTreeMap<String, String>, body: &[u8]) -> Result<Reply, Reply> {
        let obj: Value = serde_json::from_slice(body)
            .map_err(|e| bad_request(&format!("the body of the request was not JSON: {e}")))?;
        let mut g = self.lock();
        let obj = Self::prepare_create(&mut g, t, obj, None, false)?;
        if q.get("dryRun").is_some_and(|d| d == "All") {
            return Ok((201, obj));
        }
        Ok((201, self.commit(&mut g, t.res, obj, None, false)))
    }

    /// 409 when `obj` carries a resourceVersion or uid that is not `old`'s.
    fn preconditions(t: &Target, old: &Value, obj: &Value) -> Result<(), Reply> {
        let name = meta_str(old, "name");
        let rv = meta_str(obj, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(old, "resourceVersion") {
            return Err(t.conflict(name, MODIFIED));
        }
        let uid = meta_str(obj, "uid");
        if !uid.is_empty() && uid != meta_str(old, "uid") {
            let why = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(old, "uid")
            );
            return Err(t.conflict(name, &why));
        }
        Ok(())
    }

    /// Stores `candidate` as the new version of `old` with the subresource rules and the
    /// server's fields (see the module doc): 200.
    fn finish_update(
        &self,
        g: &mut Inner,
        t: &Target,
        old: Value,
        candidate: Value,
        dry: bool,
    ) -> Result<Reply, Reply> {
        let mut new = candidate;
        if !new.is_object() {
            return Err(bad_request("the object is not a JSON object"));
        }
        if t.res.status {
            if t.status {
                let st = new.get("status").cloned();
                new = old.clone();
                set_or_remove(&mut new, "status", st);
            } else {
                set_or_remove(&mut new, "status", old.get("status").cloned());
            }
        }
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = old["kind"].clone();
        if !new["metadata"].is_object() {
            new["metadata"] = json!({});
        }
        for f in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            set_or_remove(&mut new["metadata"], f, old["metadata"].get(f).cloned());
        }
        if new == old {
            return Ok((200, old));
        }
        if !same_outside_meta(&old, &new) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            new["metadata"]["generation"] = json!(generation);
        }
        if dry {
            return Ok((200, new));
        }
        let key = key_of(&old);
        let prev = g.objects.get_mut(t.res.plural).and_then(|m| m.remove(&key));
        if is_deleted_on_update(&new) {
            return Ok((200, self.commit(g, t.res, new, None, true)));
        }
        Ok((200, self.commit(g, t.res, new, prev, false)))
    }

    fn update(&self, t: &Target, q: &BTreeMap<String, String>, body: &[u8]) -> Result<Reply, Reply> {
        let name = t.name.as_deref().unwrap();
        let obj: Value = serde_json::from_slice(body)
            .map_err(|e| bad_request(&format!("the body of the request was not JSON: {e}")))?;
        if !obj.is_object() {
            return Err(bad_request("the body of the request is not an object"));
        }
        Self::check_types(t, &obj, false)?;
        let body_name = meta_str(&obj, "name");
        if body_name != name {
            return Err(bad_request(&format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_ns = meta_str(&obj, "namespace");
        if t.res.namespaced && !body_ns.is_empty() && body_ns != t.ns_key() {
            return Err(bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut g = self.lock();
        let Some(old) = g.objects.get(t.res.plural).and_then(|m| m.get(&(t.ns_key(), name.to_string()))).cloned()
        else {
            return Err(t.not_found(name));
        };
        Self::preconditions(t, &old, &obj)?;
        self.finish_update(&mut g, t, old, obj, q.get("dryRun").is_some_and(|d| d == "All"))
    }

    fn patch(
        &self,
        t: &Target,
        q: &BTreeMap<String, String>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Reply, Reply> {
        let name = t.name.as_deref().unwrap();
        let ct = content_type(headers);
        let unsupported = || {
            let msg = format!(
                "the body of the request was in an unknown format - accepted media types include: {PATCH_TYPES}"
            );
            Err((415, status(415, "UnsupportedMediaType", &msg)))
        };
        let patch: Value = match ct.as_str() {
            "application/strategic-merge-patch+json" if t.res.custom => return unsupported(),
            "application/merge-patch+json"
            | "application/json-patch+json"
            | "application/strategic-merge-patch+json" => serde_json::from_slice(body)
                .map_err(|e| bad_request(&format!("the body of the request was not JSON: {e}")))?,
            "application/apply-patch+yaml" => {
                parse_apply(body).map_err(|e| bad_request(&format!("error decoding YAML: {e}")))?
            }
            _ => return unsupported(),
        };
        let apply = ct == "application/apply-patch+yaml";
        if apply && q.get("fieldManager").is_none_or(|m| m.is_empty()) {
            let msg = "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply requests";
            let details = json!({"group": "meta.k8s.io", "kind": "PatchOptions",
                "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply requests", "field": "fieldManager"}]});
            return Err((422, status_with(422, "Invalid", msg, details)));
        }
        if apply {
            Self::check_types(t, &patch, true)?;
        }
        let dry = q.get("dryRun").is_some_and(|d| d == "All");
        let mut g = self.lock();
        let Some(old) = g.objects.get(t.res.plural).and_then(|m| m.get(&(t.ns_key(), name.to_string()))).cloned()
        else {
            if !apply || t.status {
                return Err(t.not_found(name));
            }
            let obj = Self::prepare_create(&mut g, t, patch, Some(name), true)?;
            if dry {
                return Ok((201, obj));
            }
            return Ok((201, self.commit(&mut g, t.res, obj, None, false)));
        };
        let mut patched = old.clone();
        match ct.as_str() {
            "application/merge-patch+json" => merge(&mut patched, &patch),
            "application/json-patch+json" => {
                let Value::Array(ops) = &patch else {
                    return Err(bad_request("the body of a JSON patch must be an array of operations"));
                };
                json_patch(&mut patched, ops).map_err(|e| {
                    let msg = format!("the server rejected our request due to an error in our request: {e}");
                    (422, status_with(422, "Invalid", &msg, t.details(name, t.res.kind)))
                })?;
            }
            _ => {
                if !patch.is_object() {
                    return Err(bad_request("the body of the patch is not an object"));
                }
                strategic_merge(&mut patched, &patch, "").map_err(|e| bad_request(&e))?;
            }
        }
        Self::preconditions(t, &old, &patched)?;
        self.finish_update(&mut g, t, old, patched, dry)
    }

    /// The delete of `old` (already known to exist): 200 (gone) or 202 (finalizers wait).
    fn delete_locked(&self, g: &mut Inner, t: &Target, old: Value, dry: bool) -> Reply {
        let finalizers = old["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        if finalizers {
            if !old["metadata"]["deletionTimestamp"].is_null() {
                return (202, old);
            }
            let mut new = old.clone();
            new["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if dry {
                return (202, new);
            }
            let key = key_of(&old);
            let prev = g.objects.get_mut(t.res.plural).and_then(|m| m.remove(&key));
            return (202, self.commit(g, t.res, new, prev, false));
        }
        if dry {
            return (200, old);
        }
        let key = key_of(&old);
        g.objects.get_mut(t.res.plural).and_then(|m| m.remove(&key));
        (200, self.commit(g, t.res, old, None, true))
    }

    fn delete_options(q: &BTreeMap<String, String>, body: &[u8]) -> Result<(Value, bool), Reply> {
        let opts: Value = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(body).map_err(|e| bad_request(&format!("DeleteOptions not JSON: {e}")))?
        };
        let dry = q.get("dryRun").is_some_and(|d| d == "All")
            || opts["dryRun"].as_array().is_some_and(|d| d.iter().any(|v| v == "All"));
        Ok((opts, dry))
    }

    fn delete_one(&self, t: &Target, q: &BTreeMap<String, String>, body: &[u8]) -> Result<Reply, Reply> {
        let name = t.name.as_deref().unwrap();
        let (opts, dry) = Self::delete_options(q, body)?;
        let mut g = self.lock();
        let Some(old) = g.objects.get(t.res.plural).and_then(|m| m.get(&(t.ns_key(), name.to_string()))).cloned()
        else {
            return Err(t.not_found(name));
        };
        let pre = &opts["preconditions"];
        if let Some(rv) = pre["resourceVersion"].as_str() {
            let have = meta_str(&old, "resourceVersion");
            if rv != have {
                let why = format!("the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({have}). The object might have been modified");
                return Err(t.conflict(name, &why));
            }
        }
        if let Some(uid) = pre["uid"].as_str() {
            let have = meta_str(&old, "uid");
            if uid != have {
                let why = format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}");
                return Err(t.conflict(name, &why));
            }
        }
        Ok(self.delete_locked(&mut g, t, old, dry))
    }

    fn delete_collection(&self, t: &Target, q: &BTreeMap<String, String>, body: &[u8]) -> Result<Reply, Reply> {
        let (_, dry) = Self::delete_options(q, body)?;
        let filter = Self::filter(t, q)?;
        let mut g = self.lock();
        let doomed: Vec<Value> = g
            .objects
            .get(t.res.plural)
            .map(|m| m.values().filter(|o| filter.matches(o)).cloned().collect())
            .unwrap_or_default();
        let items: Vec<Value> = doomed.into_iter().map(|o| self.delete_locked(&mut g, t, o, dry).1).collect();
        let list = json!({"apiVersion": t.gv(), "kind": format!("{}List", t.res.kind),
            "metadata": {"resourceVersion": g.rv.to_string()}, "items": items});
        Ok((200, list))
    }
}

fn content_type(headers: &HeaderMap) -> String {
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    ct.split(';').next().unwrap_or_default().trim().to_string()
}

/// A server-side apply body: JSON, or YAML.
fn parse_apply(body: &[u8]) -> Result<Value, String> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
}

const HTTP_METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];
const VERBS: &[&str] = &["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];

fn check_spec(method: &str, resource: &str) {
    assert!(
        HTTP_METHODS.contains(&method) || VERBS.contains(&method),
        "{method:?} is neither an HTTP method ({HTTP_METHODS:?}) nor a verb ({VERBS:?})"
    );
    if resource != "*" {
        let (plural, sub) = resource.split_once('/').map_or((resource, None), |(p, s)| (p, Some(s)));
        let res = known(plural);
        assert!(sub.is_none() || sub == Some("status") && res.status, "{resource}: no such subresource");
    }
}

fn call_matches(method: &str, resource: &str, c: &Call) -> bool {
    let method_ok = if HTTP_METHODS.contains(&method) { c.method == method } else { c.verb == method };
    let resource_ok = match resource.split_once('/') {
        _ if resource == "*" => true,
        Some((plural, _)) => c.resource == plural && c.status,
        None => c.resource == resource,
    };
    method_ok && resource_ok
}

fn injected_response(code: u16) -> Response {
    let (reason, message) = match code {
        400 => ("BadRequest", "injected bad request"),
        401 => ("Unauthorized", "Unauthorized"),
        403 => ("Forbidden", "injected: forbidden"),
        404 => ("NotFound", "injected: not found"),
        409 => (
            "Conflict",
            "injected: the object has been modified; please apply your changes to the latest version and try again",
        ),
        410 => ("Expired", "injected: too old resource version"),
        422 => ("Invalid", "injected: invalid"),
        429 => ("TooManyRequests", "Too many requests, please try again later."),
        500 => ("InternalError", "Internal error occurred: injected by the fake"),
        503 => ("ServiceUnavailable", "injected: the server is currently unable to handle the request"),
        504 => ("Timeout", "injected: the server was unable to return a response in the time allotted"),
        _ => ("", "injected by the fake"),
    };
    let mut s = status(code, reason, message);
    let mut b =
        Response::builder().status(StatusCode::from_u16(code).unwrap()).header("content-type", "application/json");
    if code == 429 || code == 503 {
        s["details"] = json!({"retryAfterSeconds": 1});
        b = b.header("retry-after", "1");
    }
    b.body(Body::from(s.to_string())).unwrap()
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

/// A JSON pointer's reference tokens.
fn pointer(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path.strip_prefix('/').ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

fn array_index(tok: &str) -> Option<usize> {
    if tok.is_empty() || tok.len() > 1 && tok.starts_with('0') || !tok.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    tok.parse().ok()
}

fn resolve<'a>(doc: &'a mut Value, toks: &[String]) -> Option<&'a mut Value> {
    let mut v = doc;
    for t in toks {
        v = match v {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => a.get_mut(array_index(t)?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn jp_add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let toks = pointer(path)?;
    let Some((last, parent)) = toks.split_last() else {
        *doc = value;
        return Ok(());
    };
    match resolve(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) if last == "-" => {
            a.push(value);
            Ok(())
        }
        Some(Value::Array(a)) => match array_index(last) {
            Some(i) if i <= a.len() => {
                a.insert(i, value);
                Ok(())
            }
            _ => Err(format!("add operation does not apply: index out of bounds: {path}")),
        },
        _ => Err(format!("add operation does not apply: doc is missing path: \"{path}\": missing value")),
    }
}

fn jp_remove(doc: &mut Value, path: &str, op: &str) -> Result<Value, String> {
    let toks = pointer(path)?;
    let missing = || format!("{op} operation does not apply: doc is missing path: \"{path}\": missing value");
    let Some((last, parent)) = toks.split_last() else { return Err(format!("{op} operation cannot remove the root")) };
    match resolve(doc, parent) {
        Some(Value::Object(m)) => m.remove(last).ok_or_else(missing),
        Some(Value::Array(a)) => match array_index(last) {
            Some(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

/// JSON patch (RFC 6902), applied to `doc` in place; on an error `doc` may be half-patched
/// (the caller patches a copy).
fn json_patch(doc: &mut Value, ops: &[Value]) -> Result<(), String> {
    for op in ops {
        let path = op["path"].as_str().ok_or("an operation without a path")?;
        let value = || op.get("value").cloned().ok_or_else(|| format!("{} operation without a value", op["op"]));
        let from = || op["from"].as_str().ok_or_else(|| format!("{} operation without from", op["op"]));
        match op["op"].as_str().unwrap_or_default() {
            "add" => jp_add(doc, path, value()?)?,
            "remove" => {
                jp_remove(doc, path, "remove")?;
            }
            "replace" => {
                let toks = pointer(path)?;
                let v = value()?;
                match resolve(doc, &toks) {
                    Some(target) => *target = v,
                    None => {
                        return Err(format!(
                            "replace operation does not apply: doc is missing key: {path}: missing value"
                        ))
                    }
                }
            }
            "move" => {
                let from = from()?;
                if path.starts_with(&format!("{from}/")) {
                    return Err(format!("move operation cannot move {from} into its own child {path}"));
                }
                let v = jp_remove(doc, from, "move")?;
                jp_add(doc, path, v)?;
            }
            "copy" => {
                let from = from()?;
                let v = resolve(doc, &pointer(from)?)
                    .map(|v| v.clone())
                    .ok_or_else(|| format!("copy operation does not apply: doc is missing from path: {from}"))?;
                jp_add(doc, path, v)?;
            }
            "test" => {
                let want = value()?;
                let have = resolve(doc, &pointer(path)?).map(|v| v.clone());
                if have.as_ref() != Some(&want) {
                    return Err(format!("testing value {path} failed: test failed"));
                }
            }
            other => return Err(format!("unexpected operation {other:?}")),
        }
    }
    Ok(())
}

enum MergeKey {
    Field(&'static str),
    /// A list of primitives merged as a set.
    Set,
}

/// The patch merge key of the list `field` in an object held by `parent` (see the module doc).
fn merge_key(field: &str, parent: &str) -> Option<MergeKey> {
    const CONTAINERS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
    Some(match field {
        "conditions" | "addresses" => MergeKey::Field("type"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => MergeKey::Field("name"),
        "ports" if CONTAINERS.contains(&parent) => MergeKey::Field("containerPort"),
        "ports" if parent == "spec" => MergeKey::Field("port"),
        "volumeMounts" => MergeKey::Field("mountPath"),
        "volumeDevices" => MergeKey::Field("devicePath"),
        "ownerReferences" => MergeKey::Field("uid"),
        "podIPs" | "hostIPs" | "hostAliases" => MergeKey::Field("ip"),
        "finalizers" if parent == "metadata" => MergeKey::Set,
        _ => return None,
    })
}

/// `v` without strategic merge directives (keys starting with `$`).
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), strip(v))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// Strategic merge patch of `target` (held in the field `field` of its parent) by `patch`.
fn strategic_merge(target: &mut Value, patch: &Value, field: &str) -> Result<(), String> {
    let Value::Object(p) = patch else {
        *target = strip(patch);
        return Ok(());
    };
    if directive(patch) == Some("replace") {
        *target = strip(patch);
        return Ok(());
    }
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(_) if directive(v) == Some("delete") => {
                t.remove(k);
            }
            Value::Object(_) => strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v, k)?,
            Value::Array(items) => merge_list(t.entry(k.clone()).or_insert(Value::Null), items, k, field)?,
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    for (k, v) in p {
        if let (Some(f), Value::Array(del)) = (k.strip_prefix("$deleteFromPrimitiveList/"), v) {
            if let Some(Value::Array(list)) = t.get_mut(f) {
                list.retain(|x| !del.contains(x));
            }
        }
        if let (Some(f), Value::Array(order)) = (k.strip_prefix("$setElementOrder/"), v) {
            if let Some(Value::Array(list)) = t.get_mut(f) {
                set_order(list, order);
            }
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        t.retain(|k, _| keep.iter().any(|x| x == k));
    }
    Ok(())
}

/// Puts the elements `order` names first, in its order (an object entry names the elements
/// that have its fields).
fn set_order(list: &mut Vec<Value>, order: &[Value]) {
    let names = |o: &Value, e: &Value| match o {
        Value::Object(m) => m.iter().all(|(k, v)| e.get(k) == Some(v)),
        other => other == e,
    };
    let mut rest = std::mem::take(list);
    for o in order {
        if let Some(i) = rest.iter().position(|e| names(o, e)) {
            list.push(rest.remove(i));
        }
    }
    list.extend(rest);
}

fn merge_list(target: &mut Value, items: &[Value], field: &str, parent: &str) -> Result<(), String> {
    let replace = items.iter().any(|e| directive(e) == Some("replace"));
    match merge_key(field, parent) {
        _ if replace => {
            *target = Value::Array(items.iter().filter(|e| directive(e).is_none()).map(strip).collect());
        }
        Some(MergeKey::Field(key)) => {
            if !target.is_array() {
                *target = json!([]);
            }
            let list = target.as_array_mut().unwrap();
            for e in items {
                let Some(kv) = e.get(key).filter(|_| e.is_object()) else {
                    return Err(format!("map: {e} does not contain declared merge key: {key}"));
                };
                if directive(e) == Some("delete") {
                    list.retain(|x| x.get(key) != Some(kv));
                    continue;
                }
                match list.iter_mut().find(|x| x.get(key) == Some(kv)) {
                    Some(x) => strategic_merge(x, e, field)?,
                    None => {
                        let mut n = Value::Null;
                        strategic_merge(&mut n, e, field)?;
                        list.push(n);
                    }
                }
            }
        }
        Some(MergeKey::Set) => {
            if !target.is_array() {
                *target = json!([]);
            }
            let list = target.as_array_mut().unwrap();
            for e in items {
                if !list.contains(e) {
                    list.push(e.clone());
                }
            }
        }
        None => *target = Value::Array(items.iter().map(strip).collect()),
    }
    Ok(())
}
