//! The fake Kubernetes API server (`support::fake_kube`) as writers see it, through kube-rs
//! clients: create, replace, delete, the four patch types, the status subresource, watches of
//! written objects, 410 Gone, injected failures, lagging watchers, paging and the events
//! Recorder. Each test asserts the concrete answer a real API server gives.

mod support;

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, ObjectReference};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    Preconditions, WatchEvent, WatchParams,
};
use kube::core::Status;
use kube::runtime::watcher;
use kube::Client;
use serde_json::{json, Value};
use support::fake_kube::FakeKube;

fn client(fake: &FakeKube) -> Client {
    let config = kube::Config::new(format!("http://{}", fake.addr).parse().unwrap());
    Client::try_from(config).unwrap()
}

fn ar(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
}

fn hostsubnets(c: &Client) -> Api<DynamicObject> {
    Api::all_with(c.clone(), &ar("network.openshift.io", "HostSubnet", "hostsubnets"))
}

fn netnamespaces(c: &Client) -> Api<DynamicObject> {
    Api::all_with(c.clone(), &ar("network.openshift.io", "NetNamespace", "netnamespaces"))
}

fn host_subnet(name: &str, ip: &str, subnet: &str) -> DynamicObject {
    DynamicObject::new(name, &ar("network.openshift.io", "HostSubnet", "hostsubnets"))
        .data(json!({"host": name, "hostIP": ip, "subnet": subnet}))
}

fn net_namespace(name: &str, netid: u32) -> DynamicObject {
    DynamicObject::new(name, &ar("network.openshift.io", "NetNamespace", "netnamespaces"))
        .data(json!({"netname": name, "netid": netid}))
}

/// The Status of a refused request.
fn refused<T: std::fmt::Debug>(r: kube::Result<T>) -> Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn meta<'a>(o: &'a DynamicObject, f: &str) -> &'a str {
    match f {
        "resourceVersion" => o.metadata.resource_version.as_deref().unwrap_or_default(),
        "uid" => o.metadata.uid.as_deref().unwrap_or_default(),
        "name" => o.metadata.name.as_deref().unwrap_or_default(),
        _ => panic!("{f}"),
    }
}

fn node(name: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": "10.128.2.0/23"},
        "status": {"conditions": [
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
            {"type": "Ready", "status": "True", "reason": "KubeletReady"}],
          "addresses": [{"type": "InternalIP", "address": "172.17.0.2"}, {"type": "Hostname", "address": name}]}})
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

#[tokio::test]
async fn get_of_an_absent_object_is_a_not_found_status() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let s = refused(Api::<Node>::all(c.clone()).get("nope").await);
    assert_eq!((s.code, s.reason.as_str(), s.message.as_str()), (404, "NotFound", "nodes \"nope\" not found"));
    let d = s.details.unwrap();
    assert_eq!((d.name.as_str(), d.kind.as_str(), d.group.as_str()), ("nope", "nodes", ""));
    let s = refused(hostsubnets(&c).get("x").await);
    assert_eq!(s.message, "hostsubnets.network.openshift.io \"x\" not found");
    let d = s.details.unwrap();
    assert_eq!((d.name.as_str(), d.kind.as_str(), d.group.as_str()), ("x", "hostsubnets", "network.openshift.io"));
    // A seeded object is there, with a uid and creationTimestamp added.
    fake.put("nodes", node("node-a"));
    let n = Api::<Node>::all(c.clone()).get("node-a").await.unwrap();
    assert_eq!(n.metadata.labels.unwrap()["kubernetes.io/hostname"], "node-a");
    assert_eq!(n.metadata.uid.unwrap().len(), 36);
    assert!(n.metadata.creation_timestamp.is_some());
    assert_eq!(
        Api::<Node>::all(c.clone()).get_status("node-a").await.unwrap().status.unwrap().conditions.unwrap().len(),
        2
    );
    // Paths the server does not serve: an unknown resource, a cluster-scoped one in a
    // namespace, a status subresource a resource does not have.
    for path in
        ["/api/v1/widgets", "/api/v1/namespaces/x/nodes/node-a", "/apis/network.openshift.io/v1/hostsubnets/a/status"]
    {
        let req = axum::http::Request::get(path).body(Vec::new()).unwrap();
        let s = refused(c.request::<Value>(req).await);
        assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"), "{path}");
    }
}

#[tokio::test]
async fn create_sets_server_metadata_and_refuses_duplicates() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let api = hostsubnets(&c);
    let a = api.create(&PostParams::default(), &host_subnet("node-a", "172.17.0.2", "10.128.2.0/23")).await.unwrap();
    assert_eq!(meta(&a, "name"), "node-a");
    assert!(meta(&a, "resourceVersion").parse::<u64>().unwrap() > 100);
    assert_eq!(a.metadata.generation, Some(1));
    assert_eq!(a.data["subnet"], "10.128.2.0/23");
    let created = a.metadata.creation_timestamp.clone().unwrap();
    assert!((jiff::Timestamp::now() - created.0).get_seconds().abs() < 60, "{created:?}");
    assert_eq!(fake.object("hostsubnets", "", "node-a").unwrap()["metadata"]["uid"], meta(&a, "uid"));

    // The same name again: 409 AlreadyExists, nothing changed.
    let s = refused(api.create(&PostParams::default(), &host_subnet("node-a", "172.17.0.9", "10.129.0.0/23")).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(s.message, "hostsubnets.network.openshift.io \"node-a\" already exists");
    assert_eq!(fake.object("hostsubnets", "", "node-a").unwrap()["hostIP"], "172.17.0.2");

    // generateName: distinct names and uids.
    let mut gen = host_subnet("", "172.17.0.3", "10.130.0.0/23");
    gen.metadata.name = None;
    gen.metadata.generate_name = Some("node-".into());
    let g1 = api.create(&PostParams::default(), &gen).await.unwrap();
    let g2 = api.create(&PostParams::default(), &gen).await.unwrap();
    for g in [&g1, &g2] {
        assert!(meta(g, "name").starts_with("node-") && meta(g, "name").len() == 10, "{}", meta(g, "name"));
    }
    assert_ne!(meta(&g1, "name"), meta(&g2, "name"));
    assert_ne!(meta(&g1, "uid"), meta(&g2, "uid"));
    assert_ne!(meta(&g1, "uid"), meta(&a, "uid"));

    // No name: 422 Invalid; a name a real server refuses: 422.
    let mut nameless = host_subnet("", "172.17.0.3", "10.130.0.0/23");
    nameless.metadata.name = None;
    let s = refused(api.create(&PostParams::default(), &nameless).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(s.message, "HostSubnet.network.openshift.io \"\" is invalid: metadata.name: Required value: name or generateName is required");
    assert_eq!(s.details.unwrap().causes[0].field, "metadata.name");
    let s = refused(api.create(&PostParams::default(), &host_subnet("Node_A", "172.17.0.4", "10.131.0.0/23")).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(s.message.contains("a lowercase RFC 1123 subdomain"), "{}", s.message);

    // dryRun stores nothing; four objects, ADDED once each.
    let pp = PostParams { dry_run: true, ..Default::default() };
    let dry = api.create(&pp, &host_subnet("node-z", "172.17.0.5", "10.132.0.0/23")).await.unwrap();
    assert_eq!(meta(&dry, "name"), "node-z");
    assert!(fake.object("hostsubnets", "", "node-z").is_none());
    assert_eq!(fake.objects("hostsubnets").len(), 3);
    assert_eq!(fake.count("create", "hostsubnets"), 7);
    assert_eq!(fake.count("POST", "hostsubnets"), 7);
    assert_eq!(fake.posts().len(), 7);
    assert_eq!(fake.posts()[0].0, "/apis/network.openshift.io/v1/hostsubnets");
}

#[tokio::test]
async fn replace_with_a_stale_resource_version_conflicts() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let api = netnamespaces(&c);
    let v1 = api.create(&PostParams::default(), &net_namespace("team-a", 11)).await.unwrap();
    let mut next = v1.clone();
    next.data["netid"] = json!(12);
    let v2 = api.replace("team-a", &PostParams::default(), &next).await.unwrap();
    assert_eq!(v2.data["netid"], 12);
    assert_eq!(meta(&v2, "uid"), meta(&v1, "uid"));
    assert_eq!(v2.metadata.creation_timestamp, v1.metadata.creation_timestamp);
    assert_eq!(v2.metadata.generation, Some(2));
    let (rv1, rv2): (u64, u64) =
        (meta(&v1, "resourceVersion").parse().unwrap(), meta(&v2, "resourceVersion").parse().unwrap());
    assert!(rv2 > rv1);

    // The old version again: 409 Conflict, the real message.
    let mut stale = v1.clone();
    stale.data["netid"] = json!(13);
    let s = refused(api.replace("team-a", &PostParams::default(), &stale).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Operation cannot be fulfilled on netnamespaces.network.openshift.io \"team-a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(fake.object("netnamespaces", "", "team-a").unwrap()["netid"], 12);

    // A label: a new resourceVersion, the same generation; the same object again: a no-op.
    let mut labelled = v2.clone();
    labelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    let v3 = api.replace("team-a", &PostParams::default(), &labelled).await.unwrap();
    assert_eq!(v3.metadata.generation, Some(2));
    assert_ne!(meta(&v3, "resourceVersion"), meta(&v2, "resourceVersion"));
    let v4 = api.replace("team-a", &PostParams::default(), &v3).await.unwrap();
    assert_eq!(meta(&v4, "resourceVersion"), meta(&v3, "resourceVersion"));
    // Without a resourceVersion: unconditional.
    let mut unconditional = v4.clone();
    unconditional.metadata.resource_version = None;
    unconditional.data["netid"] = json!(14);
    assert_eq!(
        api.replace("team-a", &PostParams::default(), &unconditional).await.unwrap().metadata.generation,
        Some(3)
    );

    // Absent: 404; a body naming another object: 400.
    let s = refused(api.replace("team-b", &PostParams::default(), &net_namespace("team-b", 1)).await);
    assert_eq!((s.code, s.message.as_str()), (404, "netnamespaces.network.openshift.io \"team-b\" not found"));
    let s = refused(api.replace("team-a", &PostParams::default(), &net_namespace("team-b", 1)).await);
    assert_eq!((s.code, s.reason.as_str()), (400, "BadRequest"));
    assert_eq!(fake.count("update", "netnamespaces"), 7);
}

#[tokio::test]
async fn replace_keeps_node_status_and_status_replace_keeps_the_rest() {
    let fake = FakeKube::start().await;
    fake.put("nodes", node("node-a"));
    let c = client(&fake);
    let nodes = Api::<Node>::all(c);
    let mut n = nodes.get("node-a").await.unwrap();
    n.spec.as_mut().unwrap().unschedulable = Some(true);
    n.status.as_mut().unwrap().conditions.as_mut().unwrap().clear();
    let r = nodes.replace("node-a", &PostParams::default(), &n).await.unwrap();
    assert_eq!(r.spec.unwrap().unschedulable, Some(true));
    assert_eq!(r.status.unwrap().conditions.unwrap().len(), 2, "a PUT of the node keeps its status");

    let mut s = nodes.get("node-a").await.unwrap();
    s.status.as_mut().unwrap().conditions.as_mut().unwrap().truncate(1);
    s.metadata.labels.as_mut().unwrap().insert("x".into(), "y".into());
    s.spec.as_mut().unwrap().unschedulable = Some(false);
    let r = nodes.replace_status("node-a", &PostParams::default(), &s).await.unwrap();
    let conditions = r.status.unwrap().conditions.unwrap();
    assert_eq!(conditions.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["MemoryPressure"]);
    assert_eq!(r.spec.unwrap().unschedulable, Some(true), "a PUT of the status keeps the spec");
    assert!(!r.metadata.labels.unwrap().contains_key("x"), "and the labels");
    assert_eq!(fake.count("PUT", "nodes/status"), 1);
    assert_eq!(fake.count("PUT", "nodes"), 2);
    // No status subresource: 404.
    let leases = Api::<Lease>::namespaced(client(&fake), "kube-system");
    leases.create(&PostParams::default(), &lease("l", "a")).await.unwrap();
    let s = refused(leases.get_status("l").await);
    assert_eq!(s.code, 404);
}

fn lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: kube::core::ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn lease_create_and_replace_in_a_namespace() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let leases = Api::<Lease>::namespaced(c.clone(), "openshift-sdn");
    let l = leases.create(&PostParams::default(), &lease("sdn-controller", "master-0")).await.unwrap();
    assert_eq!(l.metadata.namespace.as_deref(), Some("openshift-sdn"));
    assert_eq!(l.metadata.generation, Some(1));
    let mut taken = l.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("master-1".into());
    let l2 = leases.replace("sdn-controller", &PostParams::default(), &taken).await.unwrap();
    assert_eq!(l2.spec.as_ref().unwrap().holder_identity.as_deref(), Some("master-1"));
    // Two candidates renewing from the same read: the second loses.
    let mut late = l.clone();
    late.spec.as_mut().unwrap().holder_identity = Some("master-2".into());
    let s = refused(leases.replace("sdn-controller", &PostParams::default(), &late).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.starts_with("Operation cannot be fulfilled on leases.coordination.k8s.io \"sdn-controller\""),
        "{}",
        s.message
    );
    assert_eq!(fake.object("leases", "openshift-sdn", "sdn-controller").unwrap()["spec"]["holderIdentity"], "master-1");
    // Namespaced: not in another namespace, listed across all.
    assert!(Api::<Lease>::namespaced(c.clone(), "default").get_opt("sdn-controller").await.unwrap().is_none());
    assert_eq!(Api::<Lease>::all(c.clone()).list(&ListParams::default()).await.unwrap().items.len(), 1);
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.starts_with("PUT /apis/coordination.k8s.io/v1/namespaces/openshift-sdn/leases/sdn-controller")));
    // A body in another namespace than the URL's: 400.
    let mut other = lease("x", "a");
    other.metadata.namespace = Some("default".into());
    assert_eq!(refused(leases.create(&PostParams::default(), &other).await).code, 400);
}

#[tokio::test]
async fn delete_honours_preconditions() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let api = hostsubnets(&c);
    let a = api.create(&PostParams::default(), &host_subnet("node-a", "172.17.0.2", "10.128.2.0/23")).await.unwrap();
    let dp = |rv: Option<&str>, uid: Option<&str>| {
        DeleteParams::default()
            .preconditions(Preconditions { resource_version: rv.map(Into::into), uid: uid.map(Into::into) })
    };
    let s = refused(api.delete("node-a", &dp(Some("1"), None)).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(s.message.contains("the ResourceVersion in the precondition (1) does not match"), "{}", s.message);
    let s = refused(api.delete("node-a", &dp(None, Some("not-the-uid"))).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(s.message.contains("Precondition failed: UID in precondition: not-the-uid"), "{}", s.message);
    assert!(fake.object("hostsubnets", "", "node-a").is_some());
    let gone = api.delete("node-a", &dp(Some(meta(&a, "resourceVersion")), Some(meta(&a, "uid")))).await.unwrap();
    let gone = gone.left().expect("the deleted object");
    assert_eq!(meta(&gone, "name"), "node-a");
    assert!(fake.object("hostsubnets", "", "node-a").is_none());
    assert_eq!(refused(api.get("node-a").await).code, 404);
    assert_eq!(refused(api.delete("node-a", &DeleteParams::default()).await).code, 404);

    // With a finalizer: marked (202), gone when the finalizer is removed.
    let mut f = host_subnet("node-f", "172.17.0.6", "10.140.0.0/23");
    f.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    api.create(&PostParams::default(), &f).await.unwrap();
    let marked = api.delete("node-f", &DeleteParams::default()).await.unwrap().left().unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(fake.object("hostsubnets", "", "node-f").is_some());
    let patch = json!({"metadata": {"finalizers": null}});
    api.patch("node-f", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert!(fake.object("hostsubnets", "", "node-f").is_none());

    // A collection, by label.
    for (name, team) in [("n1", "a"), ("n2", "b"), ("n3", "a")] {
        let mut h = host_subnet(name, "172.17.0.7", "10.141.0.0/23");
        h.metadata.labels = Some([("team".to_string(), team.to_string())].into());
        api.create(&PostParams::default(), &h).await.unwrap();
    }
    let deleted =
        api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("team=a")).await.unwrap();
    let names: Vec<String> = deleted.left().unwrap().items.iter().map(|o| meta(o, "name").to_string()).collect();
    assert_eq!(names, ["n1", "n3"]);
    assert_eq!(
        fake.objects("hostsubnets").iter().map(|o| o["metadata"]["name"].clone()).collect::<Vec<_>>(),
        [json!("n2")]
    );
}

#[tokio::test]
async fn merge_and_json_patches() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let api = netnamespaces(&c);
    let mut ns = net_namespace("team-a", 11);
    ns.metadata.labels = Some([("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())].into());
    let v1 = api.create(&PostParams::default(), &ns).await.unwrap();

    // Merge patch: set, remove (null), lists replaced.
    let p = json!({"metadata": {"labels": {"a": null, "c": "3"}}, "egressIPs": ["10.0.0.1"]});
    let v2 = api.patch("team-a", &PatchParams::default(), &Patch::Merge(&p)).await.unwrap();
    assert_eq!(
        v2.metadata.labels.clone().unwrap(),
        [("b".to_string(), "2".to_string()), ("c".to_string(), "3".to_string())].into()
    );
    assert_eq!(v2.data["egressIPs"], json!(["10.0.0.1"]));
    assert_eq!(v2.metadata.generation, Some(2));
    // A stale resourceVersion in the patch is a precondition: 409.
    let p = json!({"metadata": {"resourceVersion": meta(&v1, "resourceVersion")}, "netid": 99});
    let s = refused(api.patch("team-a", &PatchParams::default(), &Patch::Merge(&p)).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(fake.object("netnamespaces", "", "team-a").unwrap()["netid"], 11);
    // The current one is fine.
    let p = json!({"metadata": {"resourceVersion": meta(&v2, "resourceVersion")}, "netid": 12});
    assert_eq!(api.patch("team-a", &PatchParams::default(), &Patch::Merge(&p)).await.unwrap().data["netid"], 12);

    // JSON patch: every operation.
    let ops = serde_json::from_value(json!([
        {"op": "test", "path": "/netid", "value": 12},
        {"op": "replace", "path": "/netid", "value": 13},
        {"op": "add", "path": "/egressIPs/-", "value": "10.0.0.2"},
        {"op": "add", "path": "/egressIPs/0", "value": "10.0.0.0"},
        {"op": "remove", "path": "/egressIPs/1"},
        {"op": "copy", "from": "/netname", "path": "/metadata/annotations"},
        {"op": "move", "from": "/metadata/annotations", "path": "/metadata/labels/moved"},
        {"op": "add", "path": "/metadata/labels/x~1y", "value": "z"}
    ]))
    .unwrap();
    let v = api.patch("team-a", &PatchParams::default(), &Patch::Json::<()>(ops)).await.unwrap();
    assert_eq!(v.data["netid"], 13);
    assert_eq!(v.data["egressIPs"], json!(["10.0.0.0", "10.0.0.2"]));
    let labels = v.metadata.labels.unwrap();
    assert_eq!((labels["moved"].as_str(), labels["x/y"].as_str()), ("team-a", "z"));
    assert!(v.metadata.annotations.is_none());
    let rv = v.metadata.resource_version.unwrap();

    // A failed test: 422 Invalid, nothing changes (not even the first operation).
    let ops = serde_json::from_value(json!([
        {"op": "replace", "path": "/netid", "value": 50},
        {"op": "test", "path": "/netid", "value": 12}
    ]))
    .unwrap();
    let s = refused(api.patch("team-a", &PatchParams::default(), &Patch::Json::<()>(ops)).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    // A path that does not resolve: 422.
    let ops = serde_json::from_value(json!([{"op": "replace", "path": "/spec/nothing", "value": 1}])).unwrap();
    let s = refused(api.patch("team-a", &PatchParams::default(), &Patch::Json::<()>(ops)).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let stored = fake.object("netnamespaces", "", "team-a").unwrap();
    assert_eq!(
        (stored["netid"].clone(), stored["metadata"]["resourceVersion"].as_str()),
        (json!(13), Some(rv.as_str()))
    );
    // Absent: 404.
    assert_eq!(refused(api.patch("nope", &PatchParams::default(), &Patch::Merge(json!({}))).await).code, 404);
    // Every PATCH recorded, with its content type.
    let patches = fake.patches();
    assert_eq!(patches.len(), 7);
    assert_eq!(patches[0].0, "/apis/network.openshift.io/v1/netnamespaces/team-a");
    assert_eq!(patches[0].1, "application/merge-patch+json");
    assert_eq!(patches[3].1, "application/json-patch+json");
    assert_eq!(patches[3].2[0], json!({"op": "test", "path": "/netid", "value": 12}));
}

#[tokio::test]
async fn strategic_merge_of_node_status_conditions_keeps_the_others() {
    let fake = FakeKube::start().await;
    fake.put("nodes", node("node-a"));
    let nodes = Api::<Node>::all(client(&fake));
    let condition = |status: &str| {
        json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": status, "reason": "RouteCreated",
            "message": "openshift-sdn", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}})
    };
    let types = |n: &Node| -> Vec<(String, String)> {
        n.status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect()
    };
    let n = nodes.patch_status("node-a", &PatchParams::default(), &Patch::Strategic(condition("True"))).await.unwrap();
    let want = |s: &str| {
        vec![
            ("MemoryPressure".into(), "False".into()),
            ("Ready".into(), "True".into()),
            ("NetworkUnavailable".into(), s.to_string()),
        ]
    };
    assert_eq!(types(&n), want("True"));
    // The same type again: merged in place.
    let n = nodes.patch_status("node-a", &PatchParams::default(), &Patch::Strategic(condition("False"))).await.unwrap();
    assert_eq!(types(&n), want("False"));
    let stored = fake.object("nodes", "", "node-a").unwrap();
    assert_eq!(stored["status"]["conditions"][1]["reason"], "KubeletReady");
    assert_eq!(stored["status"]["conditions"][2]["message"], "openshift-sdn");
    // addresses merge by type too.
    let p = json!({"status": {"addresses": [{"type": "ExternalIP", "address": "1.2.3.4"}]}});
    let n = nodes.patch_status("node-a", &PatchParams::default(), &Patch::Strategic(p)).await.unwrap();
    assert_eq!(n.status.as_ref().unwrap().addresses.as_ref().unwrap().len(), 3);
    // $patch: delete removes one element.
    let p = json!({"status": {"conditions": [{"type": "MemoryPressure", "$patch": "delete"}]}});
    let n = nodes.patch_status("node-a", &PatchParams::default(), &Patch::Strategic(p)).await.unwrap();
    assert_eq!(types(&n)[0].0, "Ready");
    assert_eq!(types(&n).len(), 2);
    // A patch of the status that also says labels: the labels stay.
    let p = json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}});
    let n = nodes.patch_status("node-a", &PatchParams::default(), &Patch::Strategic(p)).await.unwrap();
    assert!(!n.metadata.labels.unwrap().contains_key("x"));
    // A strategic patch of the node itself: its status stays.
    let p = json!({"metadata": {"labels": {"x": "y"}}, "status": {"conditions": []}});
    let n = nodes.patch("node-a", &PatchParams::default(), &Patch::Strategic(p)).await.unwrap();
    assert_eq!(n.metadata.labels.as_ref().unwrap()["x"], "y");
    assert_eq!(types(&n).len(), 2);
    // An element without its merge key: 400.
    let p = json!({"status": {"conditions": [{"status": "True"}]}});
    assert_eq!(refused(nodes.patch_status("node-a", &PatchParams::default(), &Patch::Strategic(p)).await).code, 400);
    // Custom resources take no strategic merge patch: 415.
    let c = client(&fake);
    hostsubnets(&c)
        .create(&PostParams::default(), &host_subnet("node-a", "172.17.0.2", "10.128.2.0/23"))
        .await
        .unwrap();
    let s = refused(
        hostsubnets(&c).patch("node-a", &PatchParams::default(), &Patch::Strategic(json!({"hostIP": "1.1.1.1"}))).await,
    );
    assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));
    assert_eq!(fake.count("PATCH", "nodes/status"), 6);
    let (path, ct, _) = &fake.patches()[0];
    assert_eq!((path.as_str(), ct.as_str()), ("/api/v1/nodes/node-a/status", "application/strategic-merge-patch+json"));
}

#[tokio::test]
async fn server_side_apply() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let namespaces = Api::<Namespace>::all(c.clone());
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"a": "1"}}});
    // Without a field manager: 422, nothing created.
    let s = refused(namespaces.patch("team-a", &PatchParams::default(), &Patch::Apply(&ns)).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(s.message.contains("fieldManager: Required value"), "{}", s.message);
    assert!(fake.object("namespaces", "", "team-a").is_none());
    // Absent: created (generation 1, a uid).
    let created = namespaces.patch("team-a", &PatchParams::apply("sdn-controller"), &Patch::Apply(&ns)).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.uid.is_some());
    // Present: merged; force accepted.
    let more = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"b": "2"}}});
    let merged = namespaces.patch("team-a", &PatchParams::apply("other").force(), &Patch::Apply(&more)).await.unwrap();
    assert_eq!(
        merged.metadata.labels.unwrap(),
        [("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())].into()
    );
    assert_eq!(merged.metadata.uid, created.metadata.uid);
    assert!(fake.requests().iter().any(|r| r.contains("fieldManager=other") && r.contains("force=true")));
    // Without a kind: 400.
    let s = refused(
        namespaces
            .patch("team-a", &PatchParams::apply("m"), &Patch::Apply(json!({"metadata": {"labels": {"c": "3"}}})))
            .await,
    );
    assert_eq!(s.code, 400);

    // A YAML body (as kubectl sends), through the raw client.
    let yaml = "apiVersion: network.openshift.io/v1\nkind: NetNamespace\nmetadata:\n  name: team-b\nnetname: team-b\nnetid: 21\n";
    let req = axum::http::Request::patch("/apis/network.openshift.io/v1/netnamespaces/team-b?fieldManager=kubectl")
        .header("content-type", "application/apply-patch+yaml")
        .body(yaml.as_bytes().to_vec())
        .unwrap();
    let v: Value = c.request(req).await.unwrap();
    assert_eq!((v["netid"].clone(), v["metadata"]["name"].clone()), (json!(21), json!("team-b")));
    assert_eq!(fake.object("netnamespaces", "", "team-b").unwrap()["netid"], 21);
    assert_eq!(fake.patches().last().unwrap().2["netid"], 21, "the YAML recorded as JSON");

    // Unknown content type: 415.
    let req = axum::http::Request::patch("/apis/network.openshift.io/v1/netnamespaces/team-b")
        .header("content-type", "text/plain")
        .body(b"netid: 3".to_vec())
        .unwrap();
    let s = refused(c.request::<Value>(req).await);
    assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));
}

/// Collects watcher events until `done` says so.
async fn until_seen<K: Clone + std::fmt::Debug>(
    stream: &mut (impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin),
    seen: &mut Vec<watcher::Event<K>>,
    mut done: impl FnMut(&[watcher::Event<K>]) -> bool,
) {
    while !done(seen) {
        match stream.next().await {
            Some(Ok(e)) => seen.push(e),
            // The watcher retries by itself (a 410 Gone, for one).
            Some(Err(e)) => eprintln!("watcher error: {e}"),
            None => panic!("the watch stream ended"),
        }
    }
}

fn describe(e: &watcher::Event<DynamicObject>) -> String {
    match e {
        watcher::Event::Apply(o) => format!("apply {} {}", meta(o, "name"), o.data["netid"]),
        watcher::Event::Delete(o) => format!("delete {}", meta(o, "name")),
        watcher::Event::Init => "init".into(),
        watcher::Event::InitApply(o) => format!("init {}", meta(o, "name")),
        watcher::Event::InitDone => "init done".into(),
    }
}

#[tokio::test]
async fn watch_sees_added_modified_deleted_of_written_objects() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let api = netnamespaces(&c);
    api.create(&PostParams::default(), &net_namespace("before", 1)).await.unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    within("init", until_seen(&mut stream, &mut seen, |s| s.iter().any(|e| matches!(e, watcher::Event::InitDone))))
        .await;
    let a = api.create(&PostParams::default(), &net_namespace("team-a", 11)).await.unwrap();
    let mut b = a.clone();
    b.data["netid"] = json!(12);
    api.replace("team-a", &PostParams::default(), &b).await.unwrap();
    api.patch("team-a", &PatchParams::default(), &Patch::Merge(json!({"netid": 13}))).await.unwrap();
    api.delete("team-a", &DeleteParams::default()).await.unwrap();
    within("four events", until_seen(&mut stream, &mut seen, |s| s.len() >= 7)).await;
    let got: Vec<String> = seen.iter().map(describe).collect();
    assert_eq!(
        got,
        ["init", "init before", "init done", "apply team-a 11", "apply team-a 12", "apply team-a 13", "delete team-a"]
    );

    // A raw watch with a label selector: modified into the selection is ADDED, out of it
    // DELETED.
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut w = api.watch(&WatchParams::default().labels("team=a").disable_bookmarks(), &rv).await.unwrap().boxed();
    api.patch("before", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})))
        .await
        .unwrap();
    api.patch("before", &PatchParams::default(), &Patch::Merge(json!({"netid": 2}))).await.unwrap();
    api.patch("before", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": "b"}}})))
        .await
        .unwrap();
    api.patch("before", &PatchParams::default(), &Patch::Merge(json!({"netid": 3}))).await.unwrap();
    api.create(&PostParams::default(), &net_namespace("marker", 9).labels_from("team", "a")).await.unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 4 {
        let e = within("a selected event", w.try_next()).await.unwrap().unwrap();
        kinds.push(match e {
            WatchEvent::Added(o) => format!("ADDED {}", meta(&o, "name")),
            WatchEvent::Modified(o) => format!("MODIFIED {} {}", meta(&o, "name"), o.data["netid"]),
            WatchEvent::Deleted(o) => format!("DELETED {}", meta(&o, "name")),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(kinds, ["ADDED before", "MODIFIED before 2", "DELETED before", "ADDED marker"]);
}

trait Labelled {
    fn labels_from(self, k: &str, v: &str) -> Self;
}

impl Labelled for DynamicObject {
    fn labels_from(mut self, k: &str, v: &str) -> Self {
        self.metadata.labels = Some([(k.to_string(), v.to_string())].into());
        self
    }
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_is_gone() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let api = hostsubnets(&c);
    let a = api.create(&PostParams::default(), &host_subnet("node-a", "172.17.0.2", "10.128.2.0/23")).await.unwrap();
    api.create(&PostParams::default(), &host_subnet("node-b", "172.17.0.3", "10.129.0.0/23")).await.unwrap();
    let old_rv = meta(&a, "resourceVersion").to_string();
    // The watcher lists both, then node-b is deleted while it is not watching.
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    within("init", until_seen(&mut stream, &mut seen, |s| s.iter().any(|e| matches!(e, watcher::Event::InitDone))))
        .await;
    let watches = fake.count("watch", "hostsubnets");
    fake.delete_while_disconnected("hostsubnets", "", "node-b");
    // Its rewatch from the old version is 410 Gone: it relists and sees node-a alone.
    seen.clear();
    within(
        "the relist",
        until_seen(&mut stream, &mut seen, |s| s.iter().any(|e| matches!(e, watcher::Event::InitDone))),
    )
    .await;
    let names: Vec<String> = seen
        .iter()
        .filter_map(|e| match e {
            watcher::Event::InitApply(o) => Some(meta(o, "name").to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["node-a"]);
    assert!(fake.count("watch", "hostsubnets") > watches);
    // A raw watch from before the compaction: one ERROR event, code 410.
    let mut w = api.watch(&WatchParams::default(), &old_rv).await.unwrap().boxed();
    match within("the error", w.try_next()).await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("{other:?}"),
    }
    // Newer objects are watched as usual afterwards.
    api.create(&PostParams::default(), &host_subnet("node-c", "172.17.0.4", "10.130.0.0/23")).await.unwrap();
    within(
        "node-c",
        until_seen(&mut stream, &mut seen, |s| {
            s.iter().any(|e| matches!(e, watcher::Event::Apply(o) if meta(o, "name") == "node-c"))
        }),
    )
    .await;
}

#[tokio::test]
async fn fail_next_delay_and_count() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    let api = hostsubnets(&c);
    fake.fail_next("POST", "hostsubnets", 1, 500);
    let s = refused(api.create(&PostParams::default(), &host_subnet("node-a", "172.17.0.2", "10.128.2.0/23")).await);
    assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"));
    assert!(fake.object("hostsubnets", "", "node-a").is_none(), "an injected failure changes nothing");
    let a = api.create(&PostParams::default(), &host_subnet("node-a", "172.17.0.2", "10.128.2.0/23")).await.unwrap();
    assert_eq!(fake.count("POST", "hostsubnets"), 2);

    // 429 with Retry-After 1: kube's client retries by itself, after a second each.
    fake.fail_next("update", "hostsubnets", 2, 429);
    let t = Instant::now();
    let mut b = a.clone();
    b.data["hostIP"] = json!("172.17.0.9");
    let r = api.replace("node-a", &PostParams::default(), &b).await.unwrap();
    assert_eq!(r.data["hostIP"], "172.17.0.9");
    assert_eq!(fake.count("PUT", "hostsubnets"), 3);
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    // Only the method and resource named fail.
    fake.fail_next("delete", "hostsubnets", 1, 409);
    api.get("node-a").await.unwrap();
    assert_eq!(refused(api.delete("node-a", &DeleteParams::default()).await).reason, "Conflict");
    assert!(api.delete("node-a", &DeleteParams::default()).await.is_ok());

    // A delay holds each request.
    fake.put("nodes", node("node-a"));
    fake.delay("nodes", Duration::from_millis(300));
    let t = Instant::now();
    Api::<Node>::all(c.clone()).get("node-a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
    fake.delay("nodes", Duration::ZERO);
    let t = Instant::now();
    Api::<Node>::all(c.clone()).get("node-a").await.unwrap();
    assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    // Only the status subresource delayed.
    fake.delay("nodes/status", Duration::from_millis(300));
    let t = Instant::now();
    Api::<Node>::all(c.clone()).get("node-a").await.unwrap();
    assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    Api::<Node>::all(c.clone()).get_status("node-a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
    assert_eq!((fake.count("get", "nodes"), fake.count("GET", "nodes"), fake.count("list", "nodes")), (4, 4, 0));
    assert_eq!(fake.count("get", "nodes/status"), 1);
    assert_eq!(fake.count("GET", "hostsubnets"), 1);
    assert_eq!(fake.count("GET", "*"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_watcher_rewatches_and_misses_nothing() {
    // A broadcast of 16 events: the watcher falls behind at once.
    let fake = FakeKube::start_with_watch_buffer(16).await;
    let c = client(&fake);
    let api = netnamespaces(&c);
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    within("init", until_seen(&mut stream, &mut seen, |s| s.iter().any(|e| matches!(e, watcher::Event::InitDone))))
        .await;
    // The watch is open (a first object arrives through it), then 3000 arrive at once.
    api.create(&PostParams::default(), &net_namespace("first", 1)).await.unwrap();
    within(
        "the first",
        until_seen(&mut stream, &mut seen, |s| s.iter().any(|e| matches!(e, watcher::Event::Apply(_)))),
    )
    .await;
    let objs: Vec<Value> = (0..3000)
        .map(|i| json!({"metadata": {"name": format!("ns-{i}")}, "netname": format!("ns-{i}"), "netid": i}))
        .collect();
    fake.put_many("netnamespaces", objs);
    let mut names = std::collections::BTreeSet::new();
    within("3000 objects", async {
        while names.len() < 3000 {
            match stream.next().await.unwrap() {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    names.insert(meta(&o, "name").to_string());
                }
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    assert!(names.contains("ns-0") && names.contains("ns-2999"));
    assert!(fake.lagged_watches() >= 1, "the watcher never lagged");
    assert!(fake.count("watch", "netnamespaces") >= 2, "the watcher did not rewatch");
    assert_eq!(fake.count("list", "netnamespaces"), 1, "rewatches from the history, no relist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_creates_and_paged_lists() {
    let fake = FakeKube::start().await;
    let c = client(&fake);
    // 10,000 namespaces seeded, listed in pages of 500 by the watcher.
    let t = Instant::now();
    fake.put_many("namespaces", (0..10_000).map(|i| json!({"metadata": {"name": format!("ns-{i:05}")}})).collect());
    let seeded = t.elapsed();
    let t = Instant::now();
    let mut stream = watcher(Api::<Namespace>::all(c.clone()), watcher::Config::default()).boxed();
    let mut n = 0;
    while let Some(e) = stream.try_next().await.unwrap() {
        match e {
            watcher::Event::InitApply(_) => n += 1,
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    let listed = t.elapsed();
    assert_eq!(n, 10_000);
    assert_eq!(fake.count("list", "namespaces"), 20);
    // A page by hand: limit and continue.
    let page = Api::<Namespace>::all(c.clone()).list(&ListParams::default().limit(3)).await.unwrap();
    let names: Vec<_> = page.items.iter().map(|n| n.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["ns-00000", "ns-00001", "ns-00002"]);
    let next = ListParams::default().limit(2).continue_token(page.metadata.continue_.as_deref().unwrap());
    let page2 = Api::<Namespace>::all(c.clone()).list(&next).await.unwrap();
    assert_eq!(page2.items[0].metadata.name.as_deref(), Some("ns-00003"));
    assert_eq!(page2.metadata.resource_version, page.metadata.resource_version);
    // Field selectors.
    let one =
        Api::<Namespace>::all(c.clone()).list(&ListParams::default().fields("metadata.name=ns-04242")).await.unwrap();
    assert_eq!(one.items.len(), 1);

    // 3,000 HostSubnets created through the API, 8 at a time, while a watch is open: all seen.
    let api = hostsubnets(&c);
    let mut hs = watcher(api.clone(), watcher::Config::default()).boxed();
    let t = Instant::now();
    futures::stream::iter(0..3000)
        .map(|i| {
            let api = api.clone();
            async move {
                let h = host_subnet(&format!("node-{i}"), "172.17.0.2", "10.128.0.0/23");
                api.create(&PostParams::default(), &h).await.unwrap();
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    let created = t.elapsed();
    let mut names = std::collections::BTreeSet::new();
    within("3000 hostsubnets watched", async {
        while names.len() < 3000 {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = hs.try_next().await.unwrap().unwrap() {
                names.insert(meta(&o, "name").to_string());
            }
        }
    })
    .await;
    assert_eq!(fake.objects("hostsubnets").len(), 3000);
    eprintln!(
        "seeded 10,000 namespaces in {seeded:?}, listed them in {listed:?}, created 3,000 hostsubnets in {created:?}"
    );
    // Generous bounds: a quadratic fake takes minutes here.
    assert!(seeded < Duration::from_secs(10) && listed < Duration::from_secs(30) && created < Duration::from_secs(60));
}

#[tokio::test]
async fn recorder_events_are_stored_and_their_series_patched() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let fake = FakeKube::start().await;
    let recorder = Recorder::new(
        client(&fake),
        Reporter { controller: "sdn-controller".into(), instance: Some("master-0".into()) },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("node-a".into()),
        uid: Some("u-1".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: "SubnetAllocationFailed".into(),
        note: Some("no free subnet".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events = fake.objects("events");
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["metadata"]["namespace"], "default");
    assert_eq!(e["apiVersion"], "events.k8s.io/v1");
    assert_eq!((e["reason"].as_str(), e["note"].as_str()), (Some("SubnetAllocationFailed"), Some("no free subnet")));
    assert_eq!(e["series"]["count"], 2);
    assert_eq!(fake.posts().len(), 1);
    assert_eq!(fake.posts()[0].0, "/apis/events.k8s.io/v1/namespaces/default/events");
    let patches = fake.patches();
    assert_eq!(patches.len(), 1);
    assert!(patches[0].0.starts_with("/apis/events.k8s.io/v1/namespaces/default/events/node-a."), "{}", patches[0].0);
    assert_eq!(patches[0].1, "application/merge-patch+json");
}

#[tokio::test]
async fn discovery_finds_the_served_resources() {
    let fake = FakeKube::start().await;
    let d = kube::Discovery::new(client(&fake)).run().await.unwrap();
    let (hs, caps) = d.resolve_gvk(&GroupVersionKind::gvk("network.openshift.io", "v1", "HostSubnet")).unwrap();
    assert_eq!((hs.plural.as_str(), caps.scope.clone()), ("hostsubnets", kube::discovery::Scope::Cluster));
    let (_, caps) = d.resolve_gvk(&GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease")).unwrap();
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(d.resolve_gvk(&GroupVersionKind::gvk("", "v1", "Node")).is_some());
}
