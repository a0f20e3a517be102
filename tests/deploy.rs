//! Checks of deploy/: every Kubernetes manifest decodes into its typed k8s-openapi struct with
//! no unknown field, the ClusterRole grants exactly `sdn_node::kube::rbac_rules()`, the
//! DaemonSet has the properties the agent relies on (and passes only flags `sdn-node run`
//! accepts; its capabilities, host paths and mount propagation; the init container that
//! installs the CNI plugin with `sdn-node install-cni`, run here against a temporary
//! directory), the CRDs describe the fields the daemon reads, the example state files load
//! without problems, and the Dockerfile builds and ships both binaries.
//!
//! How unknown fields are found: k8s-openapi's structs skip fields they do not know, so decoding
//! alone accepts a misspelt `hostNetwrok: true` (only an API server's strict field validation
//! would catch it, at install time on a cluster). So each YAML document is decoded twice: into a
//! `serde_json::Value` (everything that was written) and into the typed struct, which is then
//! serialized back to a `Value` (everything the typed struct understood). Every field of the
//! first must appear, with an equal value, in the second; the second may only add fields the
//! first lacks when they hold a default (null, false, 0, "", [] or {}), which is what the typed
//! structs emit for required fields that were left out. Numbers compare as numbers (YAML `2`
//! and the typed `2.0` of an f64 field are equal). The checker itself is tested on a document
//! with a misspelt field.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, Probe, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const NAMESPACE: &str = "sdn-node";
const OVS_RUNDIR: &str = "/var/run/openvswitch";
/// Where container runtimes read CNI configurations and find plugins (their defaults).
const CNI_CONF_DIR: &str = "/etc/cni/net.d";
const CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Where the agent keeps its checkpoint of the pods (`sdn-node run --state-dir`'s default).
const STATE_DIR: &str = "/var/lib/sdn-node";
/// Where containerd and CRI-O create pod network namespaces (CNI_NETNS).
const NETNS_DIR: &str = "/var/run/netns";
/// The image the manifests run: what deploy/image/build.sh builds and tags (a `localhost/`
/// name, the same in every runtime, never resolved to Docker Hub).
const IMAGE_NAME: &str = "localhost/sdn-node";
/// The binaries in the image (deploy/image/build.sh, deploy/Dockerfile).
const AGENT_BINARY: &str = "/usr/local/bin/sdn-node";
const PLUGIN_BINARY: &str = "/usr/local/bin/sdn-node-cni";
/// The agent's AppArmor profile: deploy/apparmor/<name>, declaring `profile <name>`.
const APPARMOR_PROFILE: &str = "sdn-node";
/// Peak RSS measured by `sdn-bench churn` (docs/performance.md), MiB.
const MEASURED_PEAK_RSS_MIB: f64 = 52.8;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML files in {}", dir.display());
    files
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

// ---- the unknown-field check ------------------------------------------------------------------

fn is_default(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Where `written` and `understood` (the typed struct re-serialized) differ; see the module
/// documentation.
fn differences(path: &str, written: &Value, understood: &Value, out: &mut Vec<String>) {
    match (written, understood) {
        (Value::Object(w), Value::Object(u)) => {
            for (k, wv) in w {
                let p = format!("{path}.{k}");
                match u.get(k) {
                    Some(uv) => differences(&p, wv, uv, out),
                    None => out.push(format!("{p}: unknown field (not in the typed struct)")),
                }
            }
            for (k, uv) in u {
                if !w.contains_key(k) && !is_default(uv) {
                    out.push(format!("{path}.{k}: added by the typed struct as {uv}"));
                }
            }
        }
        (Value::Array(w), Value::Array(u)) => {
            if w.len() != u.len() {
                out.push(format!("{path}: {} items written, {} understood", w.len(), u.len()));
            }
            for (i, (wv, uv)) in w.iter().zip(u).enumerate() {
                differences(&format!("{path}[{i}]"), wv, uv, out);
            }
        }
        (Value::Number(w), Value::Number(u)) if w.as_f64() == u.as_f64() => {}
        (w, u) if w == u => {}
        (w, u) => out.push(format!("{path}: written {w}, understood as {u}")),
    }
}

/// Decodes one document into `T`, failing on type errors (with the field's path) and on any
/// field `T` does not know.
fn strict<T: DeserializeOwned + Serialize>(what: &str, doc: &Value) -> Result<T, String> {
    let typed: T = serde_path_to_error::deserialize(doc.clone())
        .map_err(|e| format!("{what}: field {}: {}", e.path(), e.inner()))?;
    let understood = serde_json::to_value(&typed).map_err(|e| format!("{what}: {e}"))?;
    let mut diffs = Vec::new();
    differences("", doc, &understood, &mut diffs);
    if diffs.is_empty() {
        Ok(typed)
    } else {
        Err(format!("{what}:\n  {}", diffs.join("\n  ")))
    }
}

// ---- the manifests ----------------------------------------------------------------------------

/// Every object of deploy/kubernetes/, decoded strictly.
#[derive(Default)]
struct Manifests {
    files: Vec<String>,
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
    crds: Vec<CustomResourceDefinition>,
    admission_policies: Vec<ValidatingAdmissionPolicy>,
    admission_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    /// The documents of 07-controller.yaml, left to [`ControllerManifests`].
    controller_docs: Vec<(String, Value)>,
}

impl Manifests {
    fn add(&mut self, what: &str, doc: &Value) -> Result<(), String> {
        let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        let what = format!("{what} ({api_version} {kind})");
        match (api_version, kind) {
            ("v1", "Namespace") => self.namespaces.push(strict(&what, doc)?),
            ("v1", "ServiceAccount") => self.service_accounts.push(strict(&what, doc)?),
            ("v1", "ConfigMap") => self.config_maps.push(strict(&what, doc)?),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => self.cluster_roles.push(strict(&what, doc)?),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                self.cluster_role_bindings.push(strict(&what, doc)?)
            }
            ("apps/v1", "DaemonSet") => self.daemon_sets.push(strict(&what, doc)?),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => self.crds.push(strict(&what, doc)?),
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => self.admission_policies.push(strict(&what, doc)?),
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
                self.admission_bindings.push(strict(&what, doc)?)
            }
            _ => return Err(format!("{what}: unexpected kind (add it to tests/deploy.rs with its typed struct)")),
        }
        Ok(())
    }

    fn load() -> Manifests {
        let dir = repo().join("deploy/kubernetes");
        let mut m = Manifests::default();
        let mut errors = Vec::new();
        for path in yaml_files(&dir) {
            let name = file_name(&path);
            if name == "kustomization.yaml" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let docs: Vec<Value> =
                serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: not valid YAML: {e}"));
            let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
            assert!(!docs.is_empty(), "{name}: no objects");
            if name == CONTROLLER_FILE {
                m.controller_docs
                    .extend(docs.into_iter().enumerate().map(|(i, d)| (format!("{name} document {}", i + 1), d)));
                m.files.push(name);
                continue;
            }
            for (i, doc) in docs.iter().enumerate() {
                if let Err(e) = m.add(&format!("{name} document {}", i + 1), doc) {
                    errors.push(e);
                }
            }
            m.files.push(name);
        }
        assert!(errors.is_empty(), "manifests that do not decode strictly:\n{}", errors.join("\n"));
        m
    }

    fn one<'a, T>(items: &'a [T], kind: &str) -> &'a T {
        assert_eq!(items.len(), 1, "expected exactly one {kind}");
        &items[0]
    }

    fn daemon_set(&self) -> &DaemonSet {
        Self::one(&self.daemon_sets, "DaemonSet")
    }

    fn container(&self) -> &Container {
        let spec = self.daemon_set().spec.as_ref().unwrap().template.spec.as_ref().expect("pod spec");
        assert_eq!(spec.containers.len(), 1, "one container");
        &spec.containers[0]
    }

    fn init_container(&self) -> &Container {
        let spec = self.daemon_set().spec.as_ref().unwrap().template.spec.as_ref().expect("pod spec");
        let init = spec.init_containers.as_deref().unwrap_or_default();
        assert_eq!(init.len(), 1, "one init container (the CNI plugin's installer)");
        &init[0]
    }

    fn config_map(&self) -> &ConfigMap {
        Self::one(&self.config_maps, "ConfigMap")
    }
}

#[test]
fn unknown_fields_are_detected() {
    let doc: Value = serde_saphyr::from_str(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  selector: {}\n  template:\n    spec:\n      hostNetwrok: true\n      containers: [{name: c}]\n",
    )
    .unwrap();
    let err = strict::<DaemonSet>("test", &doc).expect_err("a misspelt field must be rejected");
    assert!(err.contains(".spec.template.spec.hostNetwrok: unknown field"), "{err}");
    // The same document, spelt right, passes: the defaults the typed struct adds are accepted.
    let good = serde_json::to_string(&doc).unwrap().replace("hostNetwrok", "hostNetwork");
    strict::<DaemonSet>("test", &serde_json::from_str(&good).unwrap()).unwrap();
    // A wrong type is an error too, with its path.
    let doc: Value =
        serde_json::from_str(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"data":{"a":1}}"#)
            .unwrap();
    let err = strict::<ConfigMap>("test", &doc).unwrap_err();
    assert!(err.contains("data.a"), "{err}");
}

#[test]
fn every_manifest_decodes_strictly_and_is_installed() {
    let m = Manifests::load();
    assert_eq!(m.namespaces.len(), 1);
    assert_eq!(m.service_accounts.len(), 1);
    assert_eq!(m.cluster_roles.len(), 1);
    assert_eq!(m.cluster_role_bindings.len(), 1);
    assert_eq!(m.config_maps.len(), 1);
    assert_eq!(m.daemon_sets.len(), 1);
    assert_eq!(m.crds.len(), 4);
    assert_eq!(m.admission_policies.len(), 1);
    assert_eq!(m.admission_bindings.len(), 1);

    // One namespace, and every namespaced object is in it.
    assert_eq!(m.namespaces[0].metadata.name.as_deref(), Some(NAMESPACE));
    let labels = m.namespaces[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("pod-security.kubernetes.io/enforce").map(String::as_str),
        Some("privileged"),
        "hostNetwork and hostPath need the privileged Pod Security level"
    );
    for (kind, ns) in [
        ("ServiceAccount", &m.service_accounts[0].metadata.namespace),
        ("ConfigMap", &m.config_maps[0].metadata.namespace),
        ("DaemonSet", &m.daemon_sets[0].metadata.namespace),
    ] {
        assert_eq!(ns.as_deref(), Some(NAMESPACE), "{kind}'s namespace");
    }

    // kustomization.yaml lists every manifest, in the order of `kubectl apply -f`.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Kustomization {
        api_version: String,
        kind: String,
        resources: Vec<String>,
        #[serde(default)]
        images: Vec<Image>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Image {
        name: String,
        new_name: Option<String>,
        new_tag: Option<String>,
    }
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/kustomization.yaml")).unwrap();
    let k: Kustomization = serde_saphyr::from_str(&text).unwrap();
    assert_eq!((k.api_version.as_str(), k.kind.as_str()), ("kustomize.config.k8s.io/v1beta1", "Kustomization"));
    assert_eq!(k.resources, m.files, "kustomization.yaml's resources must be exactly the manifests, sorted");

    // The image is this version of sdn-node, and kustomize's `images` entry matches it.
    let version = env!("CARGO_PKG_VERSION");
    let image = m.container().image.clone().unwrap();
    assert_eq!(image, format!("{IMAGE_NAME}:{version}"), "the reference deploy/image/build.sh prints");
    let build = std::fs::read_to_string(repo().join("deploy/image/build.sh")).unwrap();
    assert!(build.contains("image=${SDN_NODE_IMAGE:-localhost/sdn-node:$version}"), "build.sh's default reference");
    assert_eq!(m.init_container().image.as_deref(), Some(image.as_str()));
    for pull in [&m.container().image_pull_policy, &m.init_container().image_pull_policy] {
        assert_eq!(pull.as_deref(), Some("IfNotPresent"), "a locally loaded image is used as it is");
    }
    let entry = k.images.iter().find(|i| i.name == IMAGE_NAME).expect("images: entry for the image");
    assert_eq!(entry.new_tag.as_deref(), Some(version));
    assert_eq!(entry.new_name.as_deref(), Some(IMAGE_NAME));
}

// ---- RBAC -------------------------------------------------------------------------------------

#[test]
fn cluster_role_is_exactly_rbac_rules() {
    let m = Manifests::load();
    let role = &m.cluster_roles[0];
    let mut granted = BTreeSet::new();
    for (i, rule) in role.rules.clone().unwrap_or_default().iter().enumerate() {
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "rule {i}: only groups/resources/verbs"
        );
        for g in rule.api_groups.clone().unwrap_or_default() {
            for r in rule.resources.clone().unwrap_or_default() {
                for v in &rule.verbs {
                    assert!(
                        granted.insert((g.clone(), r.clone(), v.clone())),
                        "rule {i}: ({g:?}, {r}, {v}) granted twice"
                    );
                }
            }
        }
    }
    let needed: BTreeSet<(String, String, String)> = sdn_node::kube::rbac_rules()
        .into_iter()
        .flat_map(|(g, r, verbs)| verbs.into_iter().map(move |v| (g.clone(), r.clone(), v)))
        .collect();
    let extra: Vec<_> = granted.difference(&needed).collect();
    let missing: Vec<_> = needed.difference(&granted).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "deploy/kubernetes/02-rbac.yaml differs from sdn_node::kube::rbac_rules(): granted but not used {extra:?}, used but not granted {missing:?}"
    );

    // The binding gives that role to the DaemonSet's service account.
    let sa = &m.service_accounts[0];
    let binding = &m.cluster_role_bindings[0];
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.metadata.namespace);
    let pod = m.daemon_set().spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name, sa.metadata.name);
}

// ---- the DaemonSet ----------------------------------------------------------------------------

/// `sdn-node run --help`.
fn run_help() -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node")).args(["run", "--help"]).output().unwrap();
    assert!(out.status.success(), "sdn-node run --help: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `sdn-node` with `args` (as the kubelet expands them) and fails if the command line
/// is rejected (clap exits 2 with a usage message at once). The paths that would touch this
/// machine are replaced first: no pod API socket, no metrics listener, an empty OVS run
/// directory and state directory. Whatever the agent does next (it fails or waits without an API server), it is
/// stopped after a few seconds.
fn assert_parses(args: &[String]) {
    let ovs = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    // Not on this machine's own /proc/sys (agent_may_write_sysctls_under_net_only runs it in a
    // mount namespace of its own).
    let mut args: Vec<String> = args.iter().filter(|a| *a != "--writable-proc-sys-net").cloned().collect();
    for (flag, value) in [
        ("--pod-api-socket", "none"),
        ("--metrics-addr", "none"),
        ("--cni-conf-dir", "none"),
        ("--ovs-rundir", ovs.path().to_str().unwrap()),
        ("--state-dir", state.path().to_str().unwrap()),
    ] {
        if let Some(i) = args.iter().position(|a| a == flag) {
            args[i + 1] = value.to_string();
        } else {
            args.extend([flag.to_string(), value.to_string()]);
        }
    }
    if !args.iter().any(|a| a == "--no-host-network") {
        args.push("--no-host-network".to_string());
    }
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(&args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(stderr.path()).unwrap_or_default();
    let rejected = status.and_then(|s| s.code()) == Some(2) && err.contains("Usage:");
    assert!(!rejected, "`sdn-node {}` is rejected:\n{err}", args.join(" "));
}

/// Whether `help` lists `flag` (a whole flag: `--node` does not match `--node-name`).
fn help_has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().next_back();
        let after = help[i + flag.len()..].chars().next();
        !matches!(before, Some(c) if c.is_alphanumeric() || c == '-')
            && !matches!(after, Some(c) if c.is_alphanumeric() || c == '-' || c == '_')
    })
}

/// The value of `--flag VALUE` (or `--flag=VALUE`) in `args`.
fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(flag).and_then(|r| r.strip_prefix('='))
        }
    })
}

/// The environment variable behind `$(VAR)`, if `value` is exactly that.
fn var_ref(value: &str) -> Option<&str> {
    value.strip_prefix("$(").and_then(|v| v.strip_suffix(')'))
}

/// What a container's argument will be once the kubelet expanded `$(VAR)` from the ConfigMap
/// (or the downward API: `None`).
fn resolved(m: &Manifests, value: &str) -> Option<String> {
    let Some(var) = var_ref(value) else { return Some(value.to_string()) };
    let env = m.container().env.clone().unwrap_or_default();
    let e =
        env.iter().find(|e| e.name == var).unwrap_or_else(|| panic!("$({var}) is used in args but not defined in env"));
    if let Some(v) = &e.value {
        return Some(v.clone());
    }
    let from = e.value_from.as_ref().unwrap_or_else(|| panic!("env {var} has no value"));
    let key = from.config_map_key_ref.as_ref()?;
    let cm = m.config_map();
    assert_eq!(Some(&key.name), cm.metadata.name.as_ref(), "env {var} refers to another ConfigMap");
    let data = cm.data.clone().unwrap_or_default();
    Some(data.get(&key.key).unwrap_or_else(|| panic!("env {var}: ConfigMap has no key {:?}", key.key)).clone())
}

fn quantity_mib(q: &str) -> f64 {
    let units = [("Ki", 1.0 / 1024.0), ("Mi", 1.0), ("Gi", 1024.0)];
    for (suffix, mib) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<f64>().unwrap() * mib;
        }
    }
    panic!("unexpected memory quantity {q:?} (use Ki, Mi or Gi)")
}

fn http_probe(probe: &Option<Probe>, what: &str) -> (String, i32, Option<String>) {
    let get = probe
        .as_ref()
        .unwrap_or_else(|| panic!("no {what}"))
        .http_get
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: not httpGet"));
    let port = match &get.port {
        IntOrString::Int(p) => *p,
        IntOrString::String(s) => panic!("{what}: use the port number, not {s:?}"),
    };
    (get.path.clone().unwrap_or_default(), port, get.host.clone())
}

#[test]
fn daemon_set_runs_the_agent_in_cluster_mode_on_every_node() {
    let m = Manifests::load();
    let ds = m.daemon_set();
    let spec = ds.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    let c = m.container();

    // Selector matches the template.
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    assert!(!selector.is_empty());
    for (k, v) in &selector {
        assert_eq!(labels.get(k), Some(v), "template lacks selector label {k}");
    }

    // Node network, node-critical, on every node, one agent per node at a time.
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("Default"), "the node's resolver: cluster DNS needs the pod network");
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()),
        "must tolerate every taint"
    );
    let strategy = spec.update_strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().unwrap();
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(0)), "never two agents on one node");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(1)));

    // The command: the agent itself (the image has no shell), which first makes /proc/sys/net
    // writable (see agent_may_write_sysctls_under_net_only).
    let command = c.command.clone().expect("command");
    assert_eq!(command, [AGENT_BINARY], "the binary, no shell");

    // Only flags `sdn-node run` accepts.
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"));
    assert_eq!(args.get(1).map(String::as_str), Some("--writable-proc-sys-net"), "first of all");
    let help = run_help();
    let flags: Vec<&str> = args.iter().filter(|a| a.starts_with("--")).map(|a| a.split('=').next().unwrap()).collect();
    assert!(flags.len() >= 3);
    let unknown: Vec<&&str> = flags.iter().filter(|f| !help_has_flag(&help, f)).collect();
    assert!(unknown.is_empty(), "flags not accepted by `sdn-node run` (see its --help): {unknown:?}\n{help}");
    // In-cluster mode: no state file, no kubeconfig; this node's name from the downward API.
    assert!(args.iter().any(|a| a == "--in-cluster"), "--in-cluster");
    assert!(arg_value(&args, "--state").is_none() && arg_value(&args, "--kubeconfig").is_none());
    let node = arg_value(&args, "--node").expect("--node");
    let node_var = var_ref(node).expect("--node $(VAR)");
    let env = c.env.clone().unwrap_or_default();
    let node_env = env.iter().find(|e| e.name == node_var).expect("the --node variable");
    let field = node_env.value_from.as_ref().and_then(|f| f.field_ref.as_ref()).expect("fieldRef");
    assert_eq!(field.field_path, "spec.nodeName");
    // Every $(VAR) is defined (the kubelet leaves undefined ones as literal text) and every
    // ConfigMap value is one the flag accepts.
    let expanded: Vec<String> = args.iter().map(|a| resolved(&m, a).unwrap_or_else(|| "node-a".to_string())).collect();
    assert_parses(&expanded);
    let log_format = resolved(&m, arg_value(&args, "--log-format").expect("--log-format")).unwrap();
    assert!(["json", "human"].contains(&log_format.as_str()), "--log-format {log_format}");
    let datapath = resolved(&m, arg_value(&args, "--datapath-type").unwrap_or("system")).unwrap();
    assert!(["system", "netdev"].contains(&datapath.as_str()), "--datapath-type {datapath}");

    // The hostPath mounts, at the paths the flags name. Each at the node's path of the same
    // name: the socket path goes into the conflist, which the runtime reads on the node.
    let volumes = pod.volumes.clone().unwrap_or_default();
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let ovs_rundir = resolved(&m, arg_value(&args, "--ovs-rundir").unwrap_or(OVS_RUNDIR)).unwrap();
    assert_eq!(ovs_rundir, OVS_RUNDIR);
    host_path_mount(&volumes, &mounts, OVS_RUNDIR, Writable::Yes, None);
    let socket = resolved(&m, arg_value(&args, "--pod-api-socket").unwrap_or(sdn_node::api::DEFAULT_SOCKET)).unwrap();
    assert_eq!(socket, sdn_node::api::DEFAULT_SOCKET, "the CNI plugin's default socket");
    let socket_dir = Path::new(&socket).parent().unwrap().to_str().unwrap().to_string();
    assert_eq!(socket_dir, "/var/run/sdn-node");
    host_path_mount(&volumes, &mounts, &socket_dir, Writable::Yes, None);
    // The conflist goes where the runtime reads CNI configurations.
    let conf_dir = resolved(&m, arg_value(&args, "--cni-conf-dir").expect("--cni-conf-dir")).unwrap();
    assert_eq!(conf_dir, CNI_CONF_DIR, "--cni-conf-dir is the runtime's configuration directory");
    host_path_mount(&volumes, &mounts, &conf_dir, Writable::Yes, None);
    // Pod network namespaces created after the agent started must appear in the container.
    host_path_mount(&volumes, &mounts, NETNS_DIR, Writable::No, Some("HostToContainer"));
    // The agent's checkpoint of its pods must outlive the agent's container (and the node's
    // Open vSwitch database): a node directory, not the container's.
    let state_dir = resolved(&m, arg_value(&args, "--state-dir").unwrap_or(STATE_DIR)).unwrap();
    assert_eq!(state_dir, STATE_DIR);
    host_path_mount(&volumes, &mounts, &state_dir, Writable::Yes, None);
    assert_eq!(mounts.len(), 5, "the agent mounts OVS's, its run and state directories, the CNI config and the netns directories");
    // The plugin directory: mounted by the init container only.
    let init = m.init_container();
    let init_mounts = init.volume_mounts.clone().unwrap_or_default();
    assert_eq!(init_mounts.len(), 1, "the installer mounts the plugin directory only");
    let bin_vol = volumes.iter().find(|v| v.name == init_mounts[0].name).expect("the installer's volume");
    assert_eq!(bin_vol.host_path.as_ref().map(|h| h.path.as_str()), Some(CNI_BIN_DIR));
    assert!(!mounts.iter().any(|vm| vm.name == bin_vol.name), "the agent does not mount the plugin directory");
    assert_eq!(volumes.len(), 6, "only the six hostPath volumes");
    for v in &volumes {
        let hp = v.host_path.as_ref().unwrap_or_else(|| panic!("volume {}: not a hostPath", v.name));
        assert_eq!(hp.type_.as_deref(), Some("DirectoryOrCreate"), "{}: the agent may start first", hp.path);
    }

    // Probes on /healthz and /readyz, on the address --metrics-addr serves.
    let metrics_addr: std::net::SocketAddr = resolved(&m, arg_value(&args, "--metrics-addr").expect("--metrics-addr"))
        .unwrap()
        .parse()
        .expect("--metrics-addr is IP:PORT");
    let (live_path, live_port, live_host) = http_probe(&c.liveness_probe, "livenessProbe");
    let (ready_path, ready_port, ready_host) = http_probe(&c.readiness_probe, "readinessProbe");
    assert_eq!(live_path, "/healthz");
    assert_eq!(ready_path, "/readyz");
    if c.startup_probe.is_some() {
        let (path, port, host) = http_probe(&c.startup_probe, "startupProbe");
        assert_eq!((path.as_str(), port, host.as_deref()), ("/healthz", live_port, live_host.as_deref()));
    }
    for (port, host) in [(live_port, live_host), (ready_port, ready_host)] {
        assert_eq!(port, i32::from(metrics_addr.port()), "probe port = --metrics-addr's port");
        // Without `host` the kubelet probes the pod IP (= the node IP here), which a
        // 127.0.0.1 listener does not answer.
        let reachable = match host.as_deref() {
            Some("127.0.0.1") => metrics_addr.ip().is_loopback() || metrics_addr.ip().is_unspecified(),
            _ => metrics_addr.ip().is_unspecified(),
        };
        assert!(reachable, "a probe to {host:?}:{port} does not reach --metrics-addr {metrics_addr}");
    }

    // Resources: requests cover the measured peak RSS; a memory limit above it.
    let res = c.resources.as_ref().expect("resources");
    let requests = res.requests.clone().unwrap_or_default();
    let limits = res.limits.clone().unwrap_or_default();
    assert!(requests.contains_key("cpu"), "cpu request");
    let req_mem = quantity_mib(&requests.get("memory").expect("memory request").0);
    let lim_mem = quantity_mib(&limits.get("memory").expect("memory limit").0);
    assert!(
        req_mem >= MEASURED_PEAK_RSS_MIB,
        "memory request {req_mem} MiB < measured peak {MEASURED_PEAK_RSS_MIB} MiB"
    );
    assert!(lim_mem >= 2.0 * req_mem, "memory limit leaves headroom for the API caches");

    // Two capabilities, not privileged.
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.privileged, Some(false), "capabilities, not privileged");
    assert_eq!(sc.run_as_user, Some(0), "root: OVS's sockets are root-owned");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "every capability dropped first");
    let added: BTreeSet<String> = caps.add.clone().unwrap_or_default().into_iter().collect();
    assert_eq!(
        added,
        BTreeSet::from(["NET_ADMIN".to_string(), "SYS_ADMIN".to_string()]),
        "NET_ADMIN (netlink, nftables, ethtool, net.* sysctls) and SYS_ADMIN (setns into pod namespaces), nothing else"
    );
    for c in &added {
        assert!(!c.starts_with("CAP_"), "{c}: Kubernetes names capabilities without CAP_");
    }
    // The API server refuses allowPrivilegeEscalation: false together with SYS_ADMIN.
    assert_ne!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()), Some("RuntimeDefault"));
    // The runtimes' default AppArmor profile denies mount and writes under /proc/sys/net: the
    // agent's own profile (apparmor_profile_allows_what_the_agent_does), never unconfined.
    let aa = sc.app_armor_profile.as_ref().expect("appArmorProfile");
    assert_eq!((aa.type_.as_str(), aa.localhost_profile.as_deref()), ("Localhost", Some(APPARMOR_PROFILE)));
    assert!(pod.security_context.as_ref().and_then(|p| p.app_armor_profile.as_ref()).is_none());
    assert!(pod.security_context.as_ref().and_then(|p| p.seccomp_profile.as_ref()).is_none(), "seccomp set on the container");
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Writable {
    Yes,
    No,
}

/// Asserts a mount at `dir` of the node's directory `dir` (a hostPath volume), writable or
/// not, with `propagation` (None: the default, none).
fn host_path_mount(
    volumes: &[k8s_openapi::api::core::v1::Volume],
    mounts: &[k8s_openapi::api::core::v1::VolumeMount],
    dir: &str,
    writable: Writable,
    propagation: Option<&str>,
) {
    let mount = mounts.iter().find(|vm| vm.mount_path == dir).unwrap_or_else(|| panic!("no mount at {dir}"));
    match writable {
        Writable::Yes => assert_ne!(mount.read_only, Some(true), "{dir} must be writable"),
        Writable::No => assert_eq!(mount.read_only, Some(true), "{dir} is only read: mount it read-only"),
    }
    assert_eq!(mount.mount_propagation.as_deref(), propagation, "{dir}: mountPropagation");
    let vol = volumes.iter().find(|v| v.name == mount.name).unwrap();
    let hp = vol.host_path.as_ref().unwrap_or_else(|| panic!("{dir}: not a hostPath volume"));
    assert_eq!(hp.path, dir, "{dir}: the node's directory of the same name");
}

/// The agent makes /proc/sys/net, and only it, writable in its own mount namespace before
/// anything else (`run --writable-proc-sys-net`: the runtime mounts /proc/sys read-only and
/// refuses volumes inside /proc, and the image has no shell or mount(8) to do it). Run here in
/// a private mount namespace with /proc/sys made read-only the way runtimes do it: the agent
/// with a state file that does not exist does its two mounts, then exits 1 on the state file;
/// the namespace keeps the mounts, so a write under net.* then works and one under kernel.*
/// still fails.
#[test]
fn agent_may_write_sysctls_under_net_only() {
    let m = Manifests::load();
    assert_eq!(m.container().command.clone().unwrap(), [AGENT_BINARY]);
    let args = m.container().args.clone().unwrap_or_default();
    assert_eq!(args[..2], ["run", "--writable-proc-sys-net"]);
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none_or(|v| v.is_empty()), "CI is set and this test needs root");
        eprintln!("SKIPPED: running the agent's mounts needs root");
        return;
    }
    let ovs = tempfile::tempdir().unwrap();
    let agent = format!(
        "{} run --writable-proc-sys-net --state /nonexistent/state.yaml --no-host-network --pod-api-socket none \
         --metrics-addr none --cni-conf-dir none --state-dir none --ovs-rundir {} 2>/dev/null; echo EXIT=$?",
        env!("CARGO_BIN_EXE_sdn-node"),
        ovs.path().display()
    );
    // The write the agent does (same value: nothing changes on this machine), then one under
    // kernel.*, which must still fail.
    let after = "v=$(cat /proc/sys/net/ipv4/ip_forward); echo $v > /proc/sys/net/ipv4/ip_forward && echo NET-OK; \
                 h=$(cat /proc/sys/kernel/hostname); (echo $h > /proc/sys/kernel/hostname) 2>/dev/null || echo KERNEL-RO";
    let runtime = "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && \
                   v=$(cat /proc/sys/net/ipv4/ip_forward) && ! (echo $v > /proc/sys/net/ipv4/ip_forward) 2>/dev/null && \
                   echo RO-FIRST";
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("{runtime} && {agent}; {after}"))
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.split_whitespace().collect::<Vec<_>>(), ["RO-FIRST", "EXIT=1", "NET-OK", "KERNEL-RO"]);
}

/// The init container runs `sdn-node install-cni` (no shell: the image has none), which
/// copies the plugin beside the agent in the image to the node's plugin directory under a
/// temporary name in that directory, then renames it: runtimes see the old or the new binary,
/// never a partial one (src/install_cni.rs's unit tests cover each step). Its command is run
/// here as the container runs it: the built agent in a stand-in for the image's directory,
/// with a stand-in plugin beside it, the node directory a temporary one holding an older
/// plugin.
#[test]
fn init_container_installs_the_plugin_atomically() {
    let m = Manifests::load();
    let init = m.init_container();
    assert_eq!(init.image, m.container().image, "the plugin comes from the agent's image (same version)");
    let mount = &init.volume_mounts.clone().unwrap_or_default()[0];
    assert_ne!(mount.read_only, Some(true));
    let command = init.command.clone().expect("command");
    assert!(init.args.is_none());
    let dir = mount.mount_path.trim_end_matches('/');
    assert_eq!(command, [AGENT_BINARY, "install-cni", "--cni-bin-dir", dir], "the subcommand, into the mounted directory");
    assert_eq!(Path::new(PLUGIN_BINARY).parent(), Path::new(AGENT_BINARY).parent(), "the plugin is beside the agent");
    assert_eq!(Path::new(PLUGIN_BINARY).file_name().unwrap(), sdn_node_cni::PLUGIN_TYPE);

    // Run it.
    let scratch = tempfile::tempdir().unwrap();
    let image_bin = scratch.path().join("usr-local-bin");
    std::fs::create_dir(&image_bin).unwrap();
    let agent = image_bin.join("sdn-node");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_sdn-node"), &agent).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_sdn-node"), &agent).unwrap();
    }
    let src = image_bin.join(sdn_node_cni::PLUGIN_TYPE);
    std::fs::write(&src, b"#!/bin/sh\necho new\n").unwrap();
    let node_dir = scratch.path().join("opt-cni-bin");
    std::fs::create_dir(&node_dir).unwrap();
    let installed = node_dir.join(sdn_node_cni::PLUGIN_TYPE);
    std::fs::write(&installed, b"old").unwrap();
    let out = std::process::Command::new(&agent).args(["install-cni", "--cni-bin-dir"]).arg(&node_dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        format!("installed {} as {} (19 bytes, mode 0755)", src.display(), installed.display()),
        "one line saying what was installed"
    );
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(&src).unwrap());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777, 0o755);
    let names: Vec<String> = std::fs::read_dir(&node_dir).unwrap().map(|e| file_name(&e.unwrap().path())).collect();
    assert_eq!(names, [sdn_node_cni::PLUGIN_TYPE], "nothing else left in the directory");
    // A missing directory: exit 1, one line naming it.
    let out = std::process::Command::new(&agent)
        .args(["install-cni", "--cni-bin-dir"])
        .arg(scratch.path().join("missing"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: --cni-bin-dir ") && stderr.contains("missing") && stderr.lines().count() == 1, "{stderr}");

    // Root without capabilities: writing a root-owned directory needs none.
    let sc = init.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.run_as_user, Some(0));
    assert_ne!(sc.privileged, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert!(caps.add.clone().unwrap_or_default().is_empty());
}

// ---- CRDs -------------------------------------------------------------------------------------

fn child<'a>(s: &'a JSONSchemaProps, name: &str) -> Option<&'a JSONSchemaProps> {
    if name == "[]" {
        return match s.items.as_ref()? {
            JSONSchemaPropsOrArray::Schema(item) => Some(item),
            JSONSchemaPropsOrArray::Schemas(_) => None,
        };
    }
    s.properties.as_ref()?.get(name)
}

/// The API server's structural-schema rules that can go wrong by hand: every node has a type,
/// `properties` only on objects, `items` (one schema) on every array.
fn check_structural(s: &JSONSchemaProps, path: &str, errors: &mut Vec<String>) {
    let ty = s.type_.as_deref().unwrap_or("");
    if ty.is_empty()
        && s.x_kubernetes_int_or_string != Some(true)
        && s.x_kubernetes_preserve_unknown_fields != Some(true)
    {
        errors.push(format!("{path}: no type"));
    }
    if s.properties.is_some() && ty != "object" {
        errors.push(format!("{path}: properties on type {ty:?}"));
    }
    if ty == "array" && !matches!(s.items, Some(JSONSchemaPropsOrArray::Schema(_))) {
        errors.push(format!("{path}: array without items"));
    }
    for r in s.required.clone().unwrap_or_default() {
        if child(s, &r).is_none() {
            errors.push(format!("{path}: required {r} is not a property"));
        }
    }
    for (name, p) in s.properties.iter().flatten() {
        check_structural(p, &format!("{path}.{name}"), errors);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(item)) = &s.items {
        check_structural(item, &format!("{path}[]"), errors);
    }
}

/// A CRD the daemon needs: (plural, kind, scope, [(field path, type)]), the fields it reads.
type ExpectedCrd = (&'static str, &'static str, &'static str, &'static [(&'static str, &'static str)]);

#[test]
fn crds_describe_what_the_daemon_reads() {
    let m = Manifests::load();
    let expected: &[ExpectedCrd] = &[
        (
            "clusternetworks",
            "ClusterNetwork",
            "Cluster",
            &[
                ("network", "string"),
                ("hostsubnetlength", "integer"),
                ("serviceNetwork", "string"),
                ("pluginName", "string"),
                ("clusterNetworks", "array"),
                ("clusterNetworks.[].CIDR", "string"),
                ("clusterNetworks.[].hostSubnetLength", "integer"),
                ("vxlanPort", "integer"),
            ],
        ),
        ("hostsubnets", "HostSubnet", "Cluster", &[("host", "string"), ("hostIP", "string"), ("subnet", "string")]),
        ("netnamespaces", "NetNamespace", "Cluster", &[("netname", "string"), ("netid", "integer")]),
        (
            "egressnetworkpolicies",
            "EgressNetworkPolicy",
            "Namespaced",
            &[
                ("spec", "object"),
                ("spec.egress", "array"),
                ("spec.egress.[].type", "string"),
                ("spec.egress.[].to", "object"),
                ("spec.egress.[].to.cidrSelector", "string"),
                ("spec.egress.[].to.dnsName", "string"),
            ],
        ),
    ];
    assert_eq!(m.crds.len(), expected.len());
    let watched: BTreeSet<(&str, &str)> = sdn_node::kube::WATCHED.iter().map(|w| (w.group, w.resource)).collect();
    let mut errors = Vec::new();
    for (plural, kind, scope, fields) in expected {
        let name = format!("{plural}.network.openshift.io");
        let crd = m
            .crds
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(&name))
            .unwrap_or_else(|| panic!("no CRD {name}"));
        assert!(watched.contains(&("network.openshift.io", *plural)), "{plural} is not in WATCHED");
        let spec = &crd.spec;
        assert_eq!(spec.group, "network.openshift.io", "{name}");
        assert_eq!(spec.names.kind, *kind, "{name}");
        assert_eq!(spec.names.plural, *plural, "{name}");
        assert_eq!(spec.scope, *scope, "{name}");
        assert_eq!(spec.versions.len(), 1, "{name}: one version");
        let v = &spec.versions[0];
        assert!(v.name == "v1" && v.served && v.storage, "{name}: v1 served and stored");
        let schema = v
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap_or_else(|| panic!("{name}: no schema"));
        assert_eq!(schema.type_.as_deref(), Some("object"));
        check_structural(schema, &name, &mut errors);
        for (path, ty) in *fields {
            let mut node = Some(schema);
            for part in path.split('.') {
                node = node.and_then(|n| child(n, part));
            }
            match node {
                None => errors.push(format!("{name}: no field {path}")),
                Some(n) if n.type_.as_deref() != Some(*ty) => {
                    errors.push(format!("{name}: {path} has type {:?}, want {ty}", n.type_))
                }
                Some(_) => {}
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));

    // The schema's limits agree with the daemon's.
    let enp = m.crds.iter().find(|c| c.spec.names.kind == "EgressNetworkPolicy").unwrap();
    let schema = enp.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap();
    let egress = child(child(schema, "spec").unwrap(), "egress").unwrap();
    assert_eq!(egress.max_items, Some(sdn_node::cluster::validate::MAX_EGRESS_RULES as i64));
    let rule_type = child(child(egress, "[]").unwrap(), "type").unwrap();
    let allowed: Vec<String> =
        rule_type.enum_.clone().unwrap_or_default().into_iter().map(|j| j.0.as_str().unwrap().to_string()).collect();
    assert_eq!(allowed, ["Allow", "Deny"]);
}

// ---- examples and the image -------------------------------------------------------------------

#[test]
fn example_states_load_without_problems() {
    for path in yaml_files(&repo().join("deploy/examples")) {
        let (state, problems) =
            sdn_node::cluster::state_file::load(&path).unwrap_or_else(|e| panic!("{}: {}", path.display(), e.0));
        assert!(problems.is_empty(), "{}: {problems:?}", path.display());
        assert!(!state.pods.is_empty(), "{}: an example should have pods", path.display());
    }
}

/// The `RUN` that checks build argument `var` (continuation lines joined), as the shell runs it.
fn pin_check(dockerfile: &str, var: &str) -> String {
    let start = dockerfile.find(&format!("RUN d=\"${{{var}#")).unwrap_or_else(|| panic!("no pin check of {var}"));
    let mut script = String::new();
    for line in dockerfile[start + 4..].lines() {
        match line.strip_suffix('\\') {
            Some(l) => script.push_str(l),
            None => {
                script.push_str(line);
                break;
            }
        }
    }
    script
}

#[test]
fn dockerfile_builds_and_ships_both_binaries() {
    let text = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    // Instructions (continuation lines and comments aside) are ones Dockerfiles have.
    let known = ["FROM", "WORKDIR", "COPY", "ENV", "RUN", "USER", "ENTRYPOINT", "CMD", "ARG", "LABEL"];
    let mut instructions = Vec::new();
    let mut continued = false;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if !continued {
            let word = t.split_whitespace().next().unwrap();
            assert!(known.contains(&word), "unexpected instruction {word:?} in: {line}");
            instructions.push(t.to_string());
        }
        continued = t.ends_with('\\');
    }
    let froms: Vec<&String> = instructions.iter().filter(|i| i.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "two stages");
    // Base images given as build arguments: by default the official tags, so that the header's
    // one-liner builds where a registry is reachable; pinned by digest for a release. Each
    // stage checks its argument before anything else runs: the default tag or that image by a
    // well-formed digest, nothing else.
    assert_eq!(froms[0], "FROM ${BUILD_IMAGE} AS build");
    assert_eq!(froms[1], "FROM ${RUNTIME_IMAGE}");
    for (var, image) in [("BUILD_IMAGE", "rust:1-bookworm"), ("RUNTIME_IMAGE", "debian:bookworm-slim")] {
        let default = format!("ARG {var}={image}");
        assert_eq!(instructions.iter().filter(|i| **i == default).count(), 1, "{default} before the first FROM");
        assert_eq!(instructions.iter().filter(|i| **i == format!("ARG {var}")).count(), 1, "ARG {var} in its stage");
    }
    let header: Vec<&str> = text.lines().take_while(|l| l.starts_with('#')).collect();
    assert!(
        header.iter().any(|l| l.trim_start_matches('#').trim() == "docker build -f deploy/Dockerfile -t localhost/sdn-node:0.1.0 .      # from the repository root"),
        "the header's one-liner needs no build argument"
    );
    let digest = "0123456789abcdef".repeat(4);
    for (var, image) in [("BUILD_IMAGE", "rust:1-bookworm"), ("RUNTIME_IMAGE", "debian:bookworm-slim")] {
        let check = pin_check(&text, var);
        let accepts = |value: &str| {
            std::process::Command::new("sh").arg("-c").arg(&check).env(var, value).output().unwrap().status.success()
        };
        assert!(accepts(image), "{var}: the default tag is accepted");
        assert!(accepts(&format!("{image}@sha256:{digest}")), "{var}: a pinned reference is accepted");
        for bad in [
            format!("{image}-x"),
            format!("{image}@sha256:"),
            format!("{image}@sha256:{}", &digest[1..]),
            format!("{image}@sha256:{}X", &digest[1..]),
            format!("{image}@sha256:{}", digest.to_uppercase()),
            format!("evil/{image}@sha256:{digest}"),
            String::new(),
        ] {
            assert!(!accepts(&bad), "{var}={bad:?} must be refused");
        }
    }
    // Both binaries: the agent, and the plugin from the workspace member cni/.
    assert!(text.contains("cargo build --release --locked -p sdn-node --bin sdn-node -p sdn-node-cni --bin sdn-node-cni"));
    let cni_manifest = std::fs::read_to_string(repo().join("cni/Cargo.toml")).unwrap();
    assert!(cni_manifest.contains("name = \"sdn-node-cni\"\npath = \"src/main.rs\""), "cni/ has the bin sdn-node-cni");
    assert!(std::fs::read_to_string(repo().join("Cargo.toml")).unwrap().contains("\"cni\""), "cni/ is a workspace member");
    assert_eq!(Path::new(PLUGIN_BINARY).file_name().unwrap(), sdn_node_cni::PLUGIN_TYPE);
    assert!(instructions.iter().any(|i| *i == format!(r#"ENTRYPOINT ["{AGENT_BINARY}"]"#)));
    // hostnet links libnftnl and libmnl: headers and pkg-config to build, libraries to run.
    let stages: Vec<&str> = text.split("\nFROM ").collect();
    assert_eq!(stages.len(), 3);
    for pkg in ["pkg-config", "libnftnl-dev", "libmnl-dev"] {
        assert!(stages[1].contains(pkg), "the build stage installs {pkg}");
    }
    for pkg in ["libnftnl11", "libmnl0"] {
        assert!(stages[2].contains(pkg), "the runtime stage installs {pkg}");
    }
    // The runtime stage copies only the two binaries from the build stage.
    let copies: Vec<&String> =
        instructions.iter().skip_while(|i| !i.starts_with("FROM ${RUNTIME_IMAGE}")).filter(|i| i.starts_with("COPY")).collect();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0], "COPY --from=build /out/sdn-node /out/sdn-node-cni /usr/local/bin/");
    let dir = Path::new(AGENT_BINARY).parent().unwrap();
    assert_eq!(Path::new(PLUGIN_BINARY).parent().unwrap(), dir);
    assert!(text.contains("install -D -m 0755 target/release/sdn-node /out/sdn-node"));
    assert!(text.contains("install -D -m 0755 target/release/sdn-node-cni /out/sdn-node-cni"));
    // The labels deploy/image/build.sh sets, the version Cargo.toml's.
    assert!(instructions.iter().any(|i| *i == format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"))), "ARG VERSION=<crate version>");
    let label = instructions.iter().find(|i| i.starts_with("LABEL ")).expect("LABEL");
    for l in ["org.opencontainers.image.version=$VERSION", "org.opencontainers.image.revision=$REVISION", "org.opencontainers.image.licenses=Apache-2.0"] {
        assert!(text.contains(l), "label {l} (in {label})");
    }
}

// ---- confinement, node writes, metrics --------------------------------------------------------

/// The agent's AppArmor profile compiles, is the one the DaemonSet names, and allows what the
/// agent does (the two mounts of its entrypoint, net.* sysctls, the mounted directories — its
/// state directory's checkpoint and lock included — the pods' namespaces, netlink) and not more (no other mount, no write elsewhere in /proc/sys,
/// no capability beyond the two, not in complain mode).
#[test]
fn apparmor_profile_allows_what_the_agent_does() {
    let path = repo().join("deploy/apparmor").join(APPARMOR_PROFILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let rules: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    assert!(
        rules.iter().any(|r| r.starts_with(&format!("profile {APPARMOR_PROFILE} ")) && !r.contains("complain") && !r.contains("unconfined")),
        "profile {APPARMOR_PROFILE}, enforcing: {rules:?}"
    );
    let caps: BTreeSet<&str> = rules.iter().filter_map(|r| r.strip_prefix("capability ")).map(|c| c.trim_end_matches(',')).collect();
    assert_eq!(caps, BTreeSet::from(["net_admin", "sys_admin"]), "the DaemonSet's two capabilities, no other");
    // The entrypoint's mounts: exactly these, and no blanket mount rule.
    let mounts: Vec<&&str> = rules.iter().filter(|r| r.starts_with("mount") || r.starts_with("remount") || r.starts_with("umount")).collect();
    assert_eq!(
        mounts,
        [&"mount options=(rw, bind) /proc/sys/net/ -> /proc/sys/net/,", &"remount options=(rw, bind) /proc/sys/net/,"],
        "the bind mount of /proc/sys/net and its read-write remount, nothing else"
    );
    let m = Manifests::load();
    let args = m.container().args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a == "--writable-proc-sys-net"), "the agent does these two mounts itself");
    assert!(
        !rules.iter().any(|r| r.contains("bin/sh") || r.contains("bin/dash") || r.contains("bin/mount")),
        "no shell or mount(8) to run: the image has none"
    );
    for needed in [
        "/proc/sys/net/** rw,",
        "deny /proc/sys/[^n]** w,",
        "deny /sys/** w,",
        "network netlink raw,",
        "network unix stream,",
        "/usr/local/bin/sdn-node ix,",
        "@{PROC}/*/ns/net r,",
        "@{PROC}/@{pid}/fd/* r,",
        "/{var/,}run/netns/* r,",
        "/{var/,}run/openvswitch/* rw,",
        "/{var/,}run/sdn-node/** rwk,",
        "/var/lib/sdn-node/** rwk,",
        "/etc/cni/net.d/** rw,",
        "/{var/,}run/secrets/kubernetes.io/serviceaccount/** r,",
    ] {
        assert!(rules.contains(&needed), "rule {needed:?} missing");
    }
    assert!(!rules.iter().any(|r| r.contains("/proc/sys/** w") || *r == "mount," || r.starts_with("capability,")), "no blanket rule");
    // Every directory the container mounts is covered.
    for vm in m.container().volume_mounts.clone().unwrap_or_default() {
        let p = vm.mount_path.replace("/var/run/", "/{var/,}run/");
        assert!(rules.iter().any(|r| r.starts_with(&p)), "no rule for the mount {}", vm.mount_path);
    }
    // It compiles (apparmor_parser without loading into the kernel).
    match std::process::Command::new("apparmor_parser").args(["--preprocess"]).arg(&path).output() {
        Ok(out) => assert!(out.status.success(), "apparmor_parser: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none_or(|v| v.is_empty()), "CI is set and apparmor_parser is missing: {e}");
            eprintln!("SKIPPED the compile check: apparmor_parser not installed ({e})");
            return;
        }
    }
    let out = std::process::Command::new("apparmor_parser").args(["-Q", "-K", "-T"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "apparmor_parser -Q: {}", String::from_utf8_lossy(&out.stderr));
}

/// `nodes patch` and `nodes/status patch` are granted cluster-wide (RBAC cannot say "this pod's
/// node"); the admission policy narrows the agent's Node writes to its own Node, the one label
/// it sets and, in status, the one condition it sets (to False only).
#[test]
fn node_writes_are_limited_to_the_agents_own_label_and_condition() {
    let m = Manifests::load();
    let policy = &m.admission_policies[0];
    let binding = &m.admission_bindings[0];
    let spec = policy.spec.as_ref().unwrap();
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"), "refused when it cannot be evaluated");
    let rules = spec.match_constraints.as_ref().and_then(|c| c.resource_rules.clone()).unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["nodes".to_string(), "nodes/status".to_string()][..]),
        "the Node itself and its status subresource"
    );
    assert_eq!(rules[0].operations.as_deref(), Some(&["UPDATE".to_string()][..]), "a PATCH is admitted as an UPDATE");
    // Only the agent's ServiceAccount, exactly.
    let sa = &m.service_accounts[0].metadata;
    let user = format!("system:serviceaccount:{}:{}", sa.namespace.as_deref().unwrap(), sa.name.as_deref().unwrap());
    let conds = spec.match_conditions.clone().unwrap_or_default();
    assert_eq!(conds.len(), 1);
    assert_eq!(conds[0].expression, format!("request.userInfo.username == '{user}'"));
    // The label is the one the agent writes.
    let vars = spec.variables.clone().unwrap_or_default();
    let label = vars.iter().find(|v| v.name == "label").expect("variable label");
    assert_eq!(label.expression, format!("'{}'", sdn_node::kube::watch::EGRESS_FAILURE_LABEL));
    let v = spec.validations.clone().unwrap_or_default();
    let all: Vec<&str> = v.iter().map(|x| x.expression.as_str()).collect();
    assert!(
        all.iter().any(|e| e.contains("request.userInfo.extra['authentication.kubernetes.io/node-name']") && e.contains("object.metadata.name")),
        "its own Node, by the node name bound into the token: {all:?}"
    );
    assert!(all.iter().any(|e| e.contains("variables.newLabels.all(") && e.contains("variables.oldLabels.all(")), "no other label, added, changed or removed");
    for part in ["object.spec == oldObject.spec", "annotations", "ownerReferences", "finalizers"] {
        assert!(all.iter().any(|e| e.contains(part)), "{part} unchanged");
    }
    // The rules of the Node itself hold for both (the status subresource cannot be a way around
    // them); those of its status only for the status subresource (the Node's own UPDATE keeps
    // the status as it was anyway).
    let status_only = |e: &&str| e.starts_with("request.subResource != 'status' || (");
    for e in all.iter().filter(|e| !status_only(e)) {
        assert!(!e.contains("subResource") && !e.contains("status"), "a rule of the Node itself: {e}");
    }
    let status_rules: Vec<&str> = all.iter().copied().filter(status_only).collect();
    assert_eq!(status_rules.len(), 2, "{all:#?}");
    for e in &status_rules {
        let open = e.matches('(').count();
        assert_eq!(open, e.matches(')').count(), "balanced: {e}");
        assert!(e.trim_end().ends_with(')'), "the whole rule is under the subresource guard: {e}");
    }
    // The condition is the one the agent writes, and the only one it may change: the others
    // compared, this one only to False, and not removed.
    let condition = vars.iter().find(|v| v.name == "condition").expect("variable condition");
    assert_eq!(condition.expression, format!("'{}'", sdn_node::kube::node_status::CONDITION));
    for v in ["newConditions", "oldConditions"] {
        let var = vars.iter().find(|x| x.name == v).unwrap_or_else(|| panic!("variable {v}"));
        let of = if v == "newConditions" { "object" } else { "oldObject" };
        assert_eq!(
            var.expression,
            format!("has({of}.status) && has({of}.status.conditions) ? {of}.status.conditions : []")
        );
    }
    let conditions = status_rules.iter().find(|e| e.contains("variables.newConditions")).expect("the conditions rule");
    for part in [
        "variables.newConditions.filter(c, c.type != variables.condition) == variables.oldConditions.filter(c, c.type != variables.condition)",
        "variables.newConditions.all(c, c.type != variables.condition || c.status == 'False')",
        "variables.oldConditions.all(c, c.type != variables.condition) || variables.newConditions.exists(c, c.type == variables.condition)",
    ] {
        assert!(conditions.contains(part), "{part}: {conditions}");
    }
    // Every other status field the policy can name is compared, old to new.
    let fields = status_rules.iter().find(|e| !e.contains("variables.newConditions")).unwrap();
    assert!(fields.contains("has(object.status) == has(oldObject.status)"), "{fields}");
    for f in [
        "addresses",
        "allocatable",
        "capacity",
        "images",
        "volumesAttached",
        "volumesInUse",
        "phase",
        "nodeInfo",
        "daemonEndpoints",
        "config",
    ] {
        let compared = fields.contains(&format!("(has(object.status.{f}) ? object.status.{f} :"))
            && fields.contains(&format!("(has(oldObject.status.{f}) ? oldObject.status.{f} :"))
            || fields.contains(&format!("object.status.{f} == oldObject.status.{f}"));
        assert!(compared, "status.{f} unchanged: {fields}");
    }
    assert!(!fields.contains("conditions"), "{fields}");
    assert!(v.iter().all(|x| x.message.as_deref().is_some_and(|m| m.contains("sdn-node"))), "every refusal says why");
    let b = binding.spec.as_ref().unwrap();
    assert_eq!(b.policy_name, policy.metadata.name.clone());
    assert_eq!(b.validation_actions.as_deref(), Some(&["Deny".to_string()][..]));
    assert!(b.match_resources.is_none() && b.param_ref.is_none(), "cluster-wide, no parameters");
    // RBAC still has to grant the writes the policy narrows.
    for resource in ["nodes", "nodes/status"] {
        assert!(
            sdn_node::kube::rbac_rules()
                .iter()
                .any(|(g, r, verbs)| g.is_empty() && r == resource && verbs.iter().any(|v| v == "patch")),
            "{resource} patch"
        );
    }
}

/// The metrics endpoint is unauthenticated: it listens on the node's loopback, and the README
/// says how to expose it safely.
#[test]
fn metrics_stay_on_the_loopback() {
    let m = Manifests::load();
    let args = m.container().args.clone().unwrap_or_default();
    let addr: std::net::SocketAddr = resolved(&m, arg_value(&args, "--metrics-addr").unwrap()).unwrap().parse().unwrap();
    assert!(addr.ip().is_loopback(), "--metrics-addr {addr}");
    let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
    let section = readme.split("\n## Metrics\n").nth(1).expect("deploy/README.md has a Metrics section");
    let section = section.split("\n## ").next().unwrap();
    for needed in ["kube-rbac-proxy", "--upstream=http://127.0.0.1:9101/", "SubjectAccessReview", "127.0.0.1:9101"] {
        assert!(section.contains(needed), "Metrics section: {needed}");
    }
}

// ---- the controller (07-controller.yaml) and the OpenShift overlay ----------------------------
//
// `sdn-node controller` as a Deployment: its RBAC is exactly `CLUSTER_RULES` (cluster-wide) and
// `NAMESPACE_RULES` (a Role in its namespace: Leases nowhere else), its arguments are accepted by
// the real binary, its ConfigMap passes `ControllerArgs::check` and agrees with the README's
// `kubeadm init`, and the pod runs on the node's network without any privilege. Each check
// collects problems instead of asserting, so that `controller_checks_catch_mistakes` can show
// every one of them failing on a broken copy of the manifests.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PodSpec, Toleration};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, Subject};
use sdn_node::controller::{ControllerArgs, Rule, CLUSTER_RULES, NAMESPACE_RULES};

const CONTROLLER_FILE: &str = "07-controller.yaml";
const CONTROLLER: &str = "sdn-node-controller";
/// Where the Deployment mounts its ConfigMap, and the file `--config` names.
const CONTROLLER_CONFIG: &str = "/etc/sdn-node-controller/controller.yaml";
/// The controller's /healthz, /readyz and /status port (its `--health-addr` default).
const CONTROLLER_HEALTH_PORT: u16 = 9103;
/// kube-controller-manager's `--node-cidr-mask-size` for IPv4 when kubeadm does not set it.
const KUBEADM_NODE_CIDR_MASK_SIZE: u8 = 24;
/// The overlay for clusters that run openshift-sdn's master.
const OPENSHIFT_OVERLAY: &str = "deploy/openshift";
/// A pod name as the downward API gives it, for `$(POD_NAME)`.
const SOME_POD_NAME: &str = "sdn-node-controller-5d8f7c9b4-x2x7q";

/// The objects of 07-controller.yaml, decoded strictly.
#[derive(Clone)]
struct ControllerManifests {
    service_account: ServiceAccount,
    cluster_role: ClusterRole,
    cluster_role_binding: ClusterRoleBinding,
    role: Role,
    role_binding: RoleBinding,
    config_map: ConfigMap,
    deployment: Deployment,
}

fn exactly_one<T>(mut items: Vec<T>, kind: &str, errors: &mut Vec<String>) -> Option<T> {
    if items.len() != 1 {
        errors.push(format!("expected exactly one {kind}, found {}", items.len()));
        return None;
    }
    items.pop()
}

impl ControllerManifests {
    /// deploy/kubernetes (the agent's objects) and the controller's.
    fn load() -> (Manifests, ControllerManifests) {
        let m = Manifests::load();
        assert!(m.files.iter().any(|f| f == CONTROLLER_FILE), "deploy/kubernetes/{CONTROLLER_FILE} is missing");
        let c = Self::decode(&m.controller_docs).unwrap_or_else(|e| panic!("{CONTROLLER_FILE}:\n{e}"));
        (m, c)
    }

    fn decode(docs: &[(String, Value)]) -> Result<ControllerManifests, String> {
        let mut errors = Vec::new();
        let (mut sa, mut cr, mut crb, mut role, mut rb, mut cm, mut dep) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for (what, doc) in docs {
            let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
            let what = format!("{what} ({api_version} {kind})");
            let r = match (api_version, kind) {
                ("v1", "ServiceAccount") => strict(&what, doc).map(|o| sa.push(o)),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict(&what, doc).map(|o| cr.push(o)),
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => strict(&what, doc).map(|o| crb.push(o)),
                ("rbac.authorization.k8s.io/v1", "Role") => strict(&what, doc).map(|o| role.push(o)),
                ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict(&what, doc).map(|o| rb.push(o)),
                ("v1", "ConfigMap") => strict(&what, doc).map(|o| cm.push(o)),
                ("apps/v1", "Deployment") => strict(&what, doc).map(|o| dep.push(o)),
                _ => Err(format!("{what}: unexpected kind (add it to tests/deploy.rs with its typed struct)")),
            };
            if let Err(e) = r {
                errors.push(e);
            }
        }
        let c = (|| {
            Some(ControllerManifests {
                service_account: exactly_one(sa, "ServiceAccount", &mut errors)?,
                cluster_role: exactly_one(cr, "ClusterRole", &mut errors)?,
                cluster_role_binding: exactly_one(crb, "ClusterRoleBinding", &mut errors)?,
                role: exactly_one(role, "Role", &mut errors)?,
                role_binding: exactly_one(rb, "RoleBinding", &mut errors)?,
                config_map: exactly_one(cm, "ConfigMap", &mut errors)?,
                deployment: exactly_one(dep, "Deployment", &mut errors)?,
            })
        })();
        match c {
            Some(c) if errors.is_empty() => Ok(c),
            _ => Err(errors.join("\n")),
        }
    }

    fn pod(&self) -> &PodSpec {
        self.deployment.spec.as_ref().expect("Deployment spec").template.spec.as_ref().expect("pod spec")
    }

    fn container(&self) -> &Container {
        let pod = self.pod();
        assert_eq!(pod.containers.len(), 1, "the controller's pod has one container");
        &pod.containers[0]
    }

    fn container_mut(&mut self) -> &mut Container {
        &mut self.deployment.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0]
    }

    fn pod_mut(&mut self) -> &mut PodSpec {
        self.deployment.spec.as_mut().unwrap().template.spec.as_mut().unwrap()
    }

    fn args(&self) -> Vec<String> {
        self.container().args.clone().unwrap_or_default()
    }
}

/// (group, resource, verb) triples a set of RBAC rules grants; wildcards, resourceNames and
/// non-resource URLs are problems (the controller's rules have none).
fn granted_by(what: &str, rules: &[PolicyRule], problems: &mut Vec<String>) -> BTreeSet<(String, String, String)> {
    let mut granted = BTreeSet::new();
    for (i, rule) in rules.iter().enumerate() {
        if rule.resource_names.is_some() || rule.non_resource_urls.is_some() {
            problems.push(format!("{what} rule {i}: only groups, resources and verbs"));
        }
        for g in rule.api_groups.clone().unwrap_or_default() {
            for r in rule.resources.clone().unwrap_or_default() {
                for v in &rule.verbs {
                    if g == "*" || r == "*" || v == "*" {
                        problems.push(format!("{what} rule {i}: wildcard in ({g:?}, {r}, {v})"));
                    }
                    if !granted.insert((g.clone(), r.clone(), v.clone())) {
                        problems.push(format!("{what} rule {i}: ({g:?}, {r}, {v}) granted twice"));
                    }
                }
            }
        }
    }
    granted
}

fn rules_set(rules: &[Rule]) -> BTreeSet<(String, String, String)> {
    rules
        .iter()
        .flat_map(|(g, r, verbs)| verbs.iter().map(move |v| (g.to_string(), r.to_string(), v.to_string())))
        .collect()
}

fn compare_rules(what: &str, rules: &[PolicyRule], needed: &[Rule], constant: &str, problems: &mut Vec<String>) {
    let granted = granted_by(what, rules, problems);
    let needed = rules_set(needed);
    let extra: Vec<_> = granted.difference(&needed).collect();
    let missing: Vec<_> = needed.difference(&granted).collect();
    if !extra.is_empty() || !missing.is_empty() {
        problems.push(format!(
            "{what} differs from sdn_node::controller::{constant}: granted but not used {extra:?}, used but not granted {missing:?}"
        ));
    }
}

fn subject_is(what: &str, subjects: &Option<Vec<Subject>>, sa: &ServiceAccount, problems: &mut Vec<String>) {
    let subjects = subjects.clone().unwrap_or_default();
    let ok = subjects.len() == 1
        && subjects[0].kind == "ServiceAccount"
        && Some(&subjects[0].name) == sa.metadata.name.as_ref()
        && subjects[0].namespace == sa.metadata.namespace;
    if !ok {
        problems.push(format!("{what}: the subject must be the controller's ServiceAccount alone, not {subjects:?}"));
    }
}

/// The controller's RBAC; `cluster_roles`: every ClusterRole installed (none may grant Leases).
fn controller_rbac_problems(c: &ControllerManifests, cluster_roles: &[ClusterRole]) -> Vec<String> {
    let mut problems = Vec::new();
    let sa = &c.service_account;
    if sa.metadata.name.as_deref() != Some(CONTROLLER) || sa.metadata.namespace.as_deref() != Some(NAMESPACE) {
        problems.push(format!("ServiceAccount must be {NAMESPACE}/{CONTROLLER}"));
    }
    // Cluster-wide: exactly CLUSTER_RULES.
    let cr = &c.cluster_role;
    compare_rules(
        "the controller's ClusterRole",
        cr.rules.as_deref().unwrap_or_default(),
        CLUSTER_RULES,
        "CLUSTER_RULES",
        &mut problems,
    );
    if cr.aggregation_rule.is_some() {
        problems.push("the controller's ClusterRole must not aggregate others".into());
    }
    let crb = &c.cluster_role_binding;
    if crb.role_ref.kind != "ClusterRole"
        || crb.role_ref.api_group != "rbac.authorization.k8s.io"
        || Some(&crb.role_ref.name) != cr.metadata.name.as_ref()
    {
        problems.push(format!("the ClusterRoleBinding must refer to ClusterRole {:?}", cr.metadata.name));
    }
    subject_is("the ClusterRoleBinding", &crb.subjects, sa, &mut problems);
    // In its namespace only: exactly NAMESPACE_RULES.
    let role = &c.role;
    compare_rules(
        "the controller's Role",
        role.rules.as_deref().unwrap_or_default(),
        NAMESPACE_RULES,
        "NAMESPACE_RULES",
        &mut problems,
    );
    if role.metadata.namespace.as_deref() != Some(NAMESPACE) {
        problems.push(format!("the Role must be in namespace {NAMESPACE}, not {:?}", role.metadata.namespace));
    }
    let rb = &c.role_binding;
    if rb.metadata.namespace.as_deref() != Some(NAMESPACE) {
        problems.push(format!("the RoleBinding must be in namespace {NAMESPACE}, not {:?}", rb.metadata.namespace));
    }
    if rb.role_ref.kind != "Role" || Some(&rb.role_ref.name) != role.metadata.name.as_ref() {
        problems.push(format!(
            "the RoleBinding must refer to Role {:?} (a ClusterRole would grant its rules through this binding too)",
            role.metadata.name
        ));
    }
    subject_is("the RoleBinding", &rb.subjects, sa, &mut problems);
    // Leases are granted in the controller's namespace only: by no ClusterRole.
    for r in cluster_roles.iter().chain([cr]) {
        for rule in r.rules.clone().unwrap_or_default() {
            let groups = rule.api_groups.clone().unwrap_or_default();
            let resources = rule.resources.clone().unwrap_or_default();
            if groups.iter().any(|g| g == "coordination.k8s.io" || g == "*")
                && resources.iter().any(|x| x == "leases" || x == "*")
            {
                problems
                    .push(format!("ClusterRole {:?} grants leases: only the controller's Role may", r.metadata.name));
            }
        }
    }
    if c.pod().service_account_name.as_deref() != Some(CONTROLLER) {
        problems.push(format!("the Deployment must run as ServiceAccount {CONTROLLER}"));
    }
    if c.pod().automount_service_account_token == Some(false) {
        problems.push("the controller needs its ServiceAccount token (--in-cluster)".into());
    }
    problems
}

/// Whether `tolerations` tolerate taint `key` with `effect`.
fn tolerates(tolerations: &[Toleration], key: &str, effect: &str) -> bool {
    tolerations.iter().any(|t| {
        t.key.as_deref() == Some(key)
            && t.operator.as_deref() == Some("Exists")
            && t.effect.as_deref().is_none_or(|e| e == effect)
            && (effect != "NoExecute" || t.toleration_seconds.is_none())
    })
}

/// The environment variable `var` of `c` comes from the downward API's `field`.
fn env_from_field(c: &Container, var: &str, field: &str) -> bool {
    c.env.clone().unwrap_or_default().iter().any(|e| {
        e.name == var && e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).is_some_and(|f| f.field_path == field)
    })
}

/// The Deployment: where and how the controller runs.
fn controller_deployment_problems(c: &ControllerManifests, agent_image: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut need = |ok: bool, what: &str| {
        if !ok {
            problems.push(what.to_string());
        }
    };
    let d = &c.deployment;
    let spec = d.spec.as_ref().unwrap();
    let pod = c.pod();
    let ctr = c.container();
    need(d.metadata.name.as_deref() == Some(CONTROLLER), "the Deployment is named sdn-node-controller");
    need(d.metadata.namespace.as_deref() == Some(NAMESPACE), "the Deployment is in namespace sdn-node");
    need(c.config_map.metadata.namespace.as_deref() == Some(NAMESPACE), "the ConfigMap is in namespace sdn-node");
    need(spec.replicas == Some(2), "replicas: 2 (one leads, one stands by)");
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    need(
        !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the selector matches the template's labels",
    );

    // Rolling updates, one replica at a time, no surge (its host port would find no node).
    let strategy = spec.strategy.clone().unwrap_or_default();
    let rolling = strategy.rolling_update.clone().unwrap_or_default();
    need(strategy.type_.as_deref() == Some("RollingUpdate"), "strategy RollingUpdate");
    need(rolling.max_unavailable == Some(IntOrString::Int(1)), "maxUnavailable: 1");
    need(rolling.max_surge == Some(IntOrString::Int(0)), "maxSurge: 0");

    // The node's network: the pod network needs the HostSubnets it writes.
    need(pod.host_network == Some(true), "hostNetwork: true (it runs before the pod network exists)");
    need(pod.dns_policy.as_deref() == Some("Default"), "dnsPolicy Default: cluster DNS needs the pod network");
    need(
        pod.priority_class_name.as_deref() == Some("system-cluster-critical"),
        "priorityClassName system-cluster-critical",
    );
    need(pod.host_pid != Some(true) && pod.host_ipc != Some(true), "no hostPID, no hostIPC");
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    for (key, effect) in [
        ("node.kubernetes.io/not-ready", "NoSchedule"),
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/network-unavailable", "NoSchedule"),
        ("node-role.kubernetes.io/control-plane", "NoSchedule"),
    ] {
        need(tolerates(&tolerations, key, effect), &format!("tolerates {key}:{effect}"));
    }
    let anti = pod.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref());
    let preferred =
        anti.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.clone()).unwrap_or_default();
    need(
        preferred.iter().any(|w| {
            let t = &w.pod_affinity_term;
            let sel = t.label_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
            t.topology_key == "kubernetes.io/hostname"
                && !sel.is_empty()
                && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
        }),
        "preferred pod anti-affinity between the replicas by kubernetes.io/hostname",
    );
    need(
        anti.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()).is_none(),
        "anti-affinity preferred, not required (a one-node cluster still runs)",
    );

    // The agent's image and binary.
    need(ctr.image.as_deref() == Some(agent_image), &format!("the image is the DaemonSet's ({agent_image})"));
    need(ctr.command == Some(vec![AGENT_BINARY.to_string()]), "command: the sdn-node binary itself");
    let args = c.args();
    let sub = args.iter().position(|a| a == "controller");
    need(sub.is_some(), "args run the `controller` subcommand");
    need(args.iter().any(|a| a == "--in-cluster") && arg_value(&args, "--kubeconfig").is_none(), "--in-cluster");
    need(arg_value(&args, "--config") == Some(CONTROLLER_CONFIG), "--config /etc/sdn-node-controller/controller.yaml");
    let identity = arg_value(&args, "--identity").and_then(var_ref);
    need(
        identity.is_some_and(|v| env_from_field(ctr, v, "metadata.name")),
        "--identity $(VAR), VAR from the downward API's metadata.name",
    );
    need(env_from_field(ctr, "POD_NAMESPACE", "metadata.namespace"), "env POD_NAMESPACE from metadata.namespace");
    for a in &args {
        if let Some(v) = var_ref(a) {
            need(ctr.env.clone().unwrap_or_default().iter().any(|e| e.name == v), &format!("$({v}) is defined in env"));
        }
    }
    // The ConfigMap is mounted where --config reads it.
    let dir = Path::new(CONTROLLER_CONFIG).parent().unwrap().to_str().unwrap();
    let file = Path::new(CONTROLLER_CONFIG).file_name().unwrap().to_str().unwrap();
    let mounts = ctr.volume_mounts.clone().unwrap_or_default();
    let volumes = pod.volumes.clone().unwrap_or_default();
    need(
        mounts.iter().any(|m| {
            m.mount_path == dir
                && m.read_only == Some(true)
                && volumes.iter().any(|v| {
                    v.name == m.name && v.config_map.as_ref().map(|cm| &cm.name) == c.config_map.metadata.name.as_ref()
                })
        }),
        "the ConfigMap is mounted read-only at /etc/sdn-node-controller",
    );
    need(c.config_map.data.as_ref().is_some_and(|d| d.contains_key(file)), "the ConfigMap has controller.yaml");
    need(volumes.iter().all(|v| v.host_path.is_none()), "no hostPath volume");

    // Probes on the health address, kept on the loopback, its port declared.
    let health: Option<std::net::SocketAddr> = arg_value(&args, "--health-addr").and_then(|a| a.parse().ok());
    need(
        health.is_some_and(|h| h.ip().is_loopback() && h.port() == CONTROLLER_HEALTH_PORT),
        "--health-addr 127.0.0.1:9103 (the node's loopback: /status is unauthenticated)",
    );
    for (probe, what, path) in
        [(&ctr.liveness_probe, "livenessProbe", "/healthz"), (&ctr.readiness_probe, "readinessProbe", "/readyz")]
    {
        let ok = probe.as_ref().and_then(|p| p.http_get.as_ref()).is_some_and(|g| {
            g.path.as_deref() == Some(path)
                && g.port == IntOrString::Int(i32::from(CONTROLLER_HEALTH_PORT))
                && g.host.as_deref() == Some("127.0.0.1")
        });
        need(ok, &format!("{what}: GET 127.0.0.1:9103{path}"));
    }
    let ports = ctr.ports.clone().unwrap_or_default();
    need(
        ports.iter().any(|p| {
            p.container_port == i32::from(CONTROLLER_HEALTH_PORT)
                && p.host_port == Some(i32::from(CONTROLLER_HEALTH_PORT))
                && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        }),
        "port 9103 declared as a host port (no two replicas on one node)",
    );

    // No privilege at all.
    let sc = ctr.security_context.clone().unwrap_or_default();
    need(sc.run_as_non_root == Some(true), "runAsNonRoot: true");
    need(sc.run_as_user.is_some_and(|u| u != 0), "runAsUser: a non-root UID");
    need(sc.privileged != Some(true), "not privileged");
    need(sc.allow_privilege_escalation == Some(false), "allowPrivilegeEscalation: false");
    need(sc.read_only_root_filesystem == Some(true), "readOnlyRootFilesystem: true");
    let caps = sc.capabilities.clone().unwrap_or_default();
    need(caps.drop == Some(vec!["ALL".to_string()]), "capabilities: drop ALL");
    need(caps.add.clone().unwrap_or_default().is_empty(), "no capability added");
    need(sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()) == Some("RuntimeDefault"), "seccomp RuntimeDefault");
    let psc = pod.security_context.clone().unwrap_or_default();
    need(
        psc.run_as_user != Some(0) && psc.run_as_non_root != Some(false),
        "the pod's securityContext does not make it root",
    );

    // Resources.
    let res = ctr.resources.clone().unwrap_or_default();
    let requests = res.requests.unwrap_or_default();
    let limits = res.limits.unwrap_or_default();
    need(requests.contains_key("cpu"), "a cpu request");
    let req_mem = requests.get("memory").map(|q| quantity_mib(&q.0));
    let lim_mem = limits.get("memory").map(|q| quantity_mib(&q.0));
    need(req_mem.is_some_and(|r| lim_mem.is_some_and(|l| l >= r)), "memory request and a limit at least as high");
    problems
}

/// `sdn-node controller --help`.
fn controller_help() -> String {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node")).args(["controller", "--help"]).output().unwrap();
    assert!(out.status.success(), "sdn-node controller --help: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The Deployment's arguments as the kubelet expands them, with the ConfigMap's file at `config`
/// for `--config` and no listener.
fn controller_args_here(c: &ControllerManifests, config: &Path) -> Vec<String> {
    let mut args: Vec<String> = c
        .args()
        .into_iter()
        .map(|a| match var_ref(&a) {
            Some(v) if env_from_field(c.container(), v, "metadata.name") => SOME_POD_NAME.to_string(),
            _ => a,
        })
        .collect();
    for (flag, value) in [("--config", config.to_str().unwrap()), ("--health-addr", "none")] {
        if let Some(i) = args.iter().position(|a| a == flag) {
            args[i + 1] = value.to_string();
        }
    }
    args
}

/// The ConfigMap's controller.yaml in a temporary directory.
fn controller_config_file(c: &ControllerManifests) -> Result<(tempfile::TempDir, PathBuf), String> {
    let file = Path::new(CONTROLLER_CONFIG).file_name().unwrap().to_str().unwrap();
    let text = c.config_map.data.as_ref().and_then(|d| d.get(file)).ok_or("the ConfigMap has no controller.yaml")?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    std::fs::write(&path, text).unwrap();
    Ok((dir, path))
}

/// The real binary and its clap parser: every flag is one `sdn-node controller --help` lists,
/// and `sdn-node` run with the Deployment's arguments (no API server here) gets past parsing
/// (clap exits 2 with a usage message) and the configuration check (exit 1 with the flag's or
/// key's name): it stops only where it needs the API server (`--in-cluster: ...`).
fn controller_args_problems(c: &ControllerManifests) -> Vec<String> {
    let mut problems = Vec::new();
    let help = controller_help();
    let args = c.args();
    for flag in args.iter().filter(|a| a.starts_with("--")).map(|a| a.split('=').next().unwrap()) {
        if !help_has_flag(&help, flag) {
            problems.push(format!("{flag} is not a flag of `sdn-node controller` (see its --help)"));
        }
    }
    let (_dir, config) = match controller_config_file(c) {
        Ok(x) => x,
        Err(e) => return vec![e],
    };
    let args = controller_args_here(c, &config);
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(&args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("KUBECONFIG")
        .env("POD_NAMESPACE", c.deployment.metadata.namespace.clone().unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let err = std::fs::read_to_string(stderr.path()).unwrap_or_default();
    let reached_the_api =
        status.and_then(|s| s.code()) == Some(1) && err.contains("sdn-node controller: --in-cluster:");
    if !reached_the_api {
        problems.push(format!(
            "`sdn-node {}` did not get past its flags and configuration (status {status:?}):\n{err}",
            args.join(" ")
        ));
    }
    problems
}

/// `kubeadm init --pod-network-cidr A --service-cidr B` as README.md gives it.
fn readme_kubeadm_cidrs() -> (String, String) {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let line = readme.lines().find(|l| l.contains("kubeadm init") && l.contains("--pod-network-cidr")).expect(
        "README.md gives the `kubeadm init --pod-network-cidr ... --service-cidr ...` line of its install section",
    );
    let words: Vec<String> = line.split_whitespace().map(|w| w.trim_matches('`').to_string()).collect();
    let value = |flag: &str| {
        arg_value(&words, flag).unwrap_or_else(|| panic!("README's kubeadm line has no {flag}: {line}")).to_string()
    };
    (value("--pod-network-cidr"), value("--service-cidr"))
}

/// The ConfigMap through `ControllerArgs::check`, with the Deployment's other flags, in this
/// process: the network it describes.
fn controller_config_problems(c: &ControllerManifests) -> Vec<String> {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }
    let mut problems = Vec::new();
    let (_dir, config) = match controller_config_file(c) {
        Ok(x) => x,
        Err(e) => return vec![e],
    };
    let data = c.config_map.data.clone().unwrap_or_default();
    if data.len() != 1 {
        problems.push(format!("the ConfigMap holds controller.yaml only, not {:?}", data.keys().collect::<Vec<_>>()));
    }
    // The subcommand's own arguments; --log-format is the binary's (checked by running it), and
    // POD_NAMESPACE (the downward API) stands as --namespace.
    let all = controller_args_here(c, &config);
    let Some(sub) = all.iter().position(|a| a == "controller") else { return vec!["no `controller` in args".into()] };
    let mut args = vec!["sdn-node-controller".to_string()];
    let mut rest = all[sub + 1..].iter();
    while let Some(a) = rest.next() {
        if a == "--log-format" {
            rest.next();
        } else if !a.starts_with("--log-format=") {
            args.push(a.clone());
        }
    }
    args.extend(["--namespace".to_string(), NAMESPACE.to_string()]);
    let cfg = match Cli::try_parse_from(&args).map_err(|e| e.to_string()).and_then(|cli| cli.args.check()) {
        Ok(cfg) => cfg,
        Err(e) => {
            problems.push(format!("ControllerArgs::check refuses the ConfigMap's controller.yaml: {e}"));
            return problems;
        }
    };
    let n = &cfg.network;
    let (pod_cidr, service_cidr) = readme_kubeadm_cidrs();
    if n.cluster_network.to_string() != pod_cidr || n.service_network.to_string() != service_cidr {
        problems.push(format!(
            "clusterNetwork {} / serviceNetwork {} differ from README's `kubeadm init --pod-network-cidr {pod_cidr} --service-cidr {service_cidr}`",
            n.cluster_network, n.service_network
        ));
    }
    if n.subnet_prefix() != KUBEADM_NODE_CIDR_MASK_SIZE {
        problems.push(format!(
            "hostSubnetLength {} gives /{} node subnets; kubeadm's Nodes get /{KUBEADM_NODE_CIDR_MASK_SIZE} podCIDRs (hostSubnetLength {})",
            n.host_subnet_length,
            n.subnet_prefix(),
            n.cluster_network.max_prefix_len() - KUBEADM_NODE_CIDR_MASK_SIZE
        ));
    }
    if n.plugin != sdn_node::domain::Plugin::NetworkPolicy {
        problems.push(format!("plugin {:?}: the manifests' default is networkpolicy", n.plugin));
    }
    if (n.vxlan_port, n.mtu) != (4789, 1450) {
        problems.push(format!("vxlanPort {} / mtu {}: the agent's defaults are 4789 / 1450", n.vxlan_port, n.mtu));
    }
    if cfg.identity != SOME_POD_NAME || cfg.namespace != NAMESPACE {
        problems
            .push(format!("identity {:?} in namespace {:?}: the pod's name, in sdn-node", cfg.identity, cfg.namespace));
    }
    if cfg.health_addr.is_some() {
        problems.push("the test's --health-addr none was not applied".into());
    }
    problems
}

#[test]
fn controller_rbac_is_exactly_cluster_and_namespace_rules() {
    let (m, c) = ControllerManifests::load();
    let problems = controller_rbac_problems(&c, &m.cluster_roles);
    assert!(problems.is_empty(), "{CONTROLLER_FILE} RBAC:\n{}", problems.join("\n"));
    assert!(!m.cluster_roles.is_empty(), "the agent's ClusterRole is checked for leases too");
}

#[test]
fn controller_deployment_runs_unprivileged_on_the_node_network() {
    let (m, c) = ControllerManifests::load();
    let agent_image = m.container().image.clone().unwrap();
    let problems = controller_deployment_problems(&c, &agent_image);
    assert!(problems.is_empty(), "{CONTROLLER_FILE} Deployment:\n{}", problems.join("\n"));
}

#[test]
fn controller_args_are_accepted_by_sdn_node_controller() {
    let (_, c) = ControllerManifests::load();
    let problems = controller_args_problems(&c);
    assert!(problems.is_empty(), "{CONTROLLER_FILE} args:\n{}", problems.join("\n"));
}

#[test]
fn controller_config_map_passes_the_controllers_check() {
    let (_, c) = ControllerManifests::load();
    let problems = controller_config_problems(&c);
    assert!(problems.is_empty(), "{CONTROLLER_FILE} ConfigMap:\n{}", problems.join("\n"));
}

/// (apiVersion, kind, namespace, name) of a manifest.
type ObjectId = (String, String, String, String);

fn object_id(doc: &Value) -> ObjectId {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
    let meta = doc.get("metadata");
    (
        s(doc.get("apiVersion")),
        s(doc.get("kind")),
        s(meta.and_then(|m| m.get("namespace"))),
        s(meta.and_then(|m| m.get("name"))),
    )
}

fn file_objects(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes").join(name)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct Overlay {
    api_version: String,
    kind: String,
    resources: Vec<String>,
    #[serde(default)]
    patches: Vec<OverlayPatch>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct OverlayPatch {
    patch: String,
}

fn openshift_overlay() -> Overlay {
    let text = std::fs::read_to_string(repo().join(OPENSHIFT_OVERLAY).join("kustomization.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// The overlay takes deploy/kubernetes whole and deletes exactly the objects of
/// 07-controller.yaml and 00-crds.yaml: the same files minus those two.
fn overlay_problems(o: &Overlay, files: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if (o.api_version.as_str(), o.kind.as_str()) != ("kustomize.config.k8s.io/v1beta1", "Kustomization") {
        problems.push("the overlay is a kustomize.config.k8s.io/v1beta1 Kustomization".into());
    }
    if o.resources != ["../kubernetes"] {
        problems.push(format!("the overlay's only resource is ../kubernetes, not {:?}", o.resources));
    }
    let mut deleted = BTreeSet::new();
    for p in &o.patches {
        let doc: Value = serde_saphyr::from_str(&p.patch).unwrap_or_default();
        let keys: BTreeSet<&str> = doc.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        let meta_keys: BTreeSet<&str> = doc
            .get("metadata")
            .and_then(Value::as_object)
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        if doc.get("$patch").and_then(Value::as_str) != Some("delete")
            || keys != BTreeSet::from(["$patch", "apiVersion", "kind", "metadata"])
            || !meta_keys.iter().all(|k| ["name", "namespace"].contains(k))
        {
            problems.push(format!("an overlay patch that is not a plain deletion:\n{}", p.patch));
        }
        deleted.insert(object_id(&doc));
    }
    let left_out = [CONTROLLER_FILE, "00-crds.yaml"];
    let expected: BTreeSet<ObjectId> = left_out.iter().flat_map(|f| file_objects(f)).map(|d| object_id(&d)).collect();
    if deleted != expected {
        problems.push(format!(
            "the overlay must delete exactly the objects of {left_out:?}: deletes but should not {:?}, should delete {:?}",
            deleted.difference(&expected).collect::<Vec<_>>(),
            expected.difference(&deleted).collect::<Vec<_>>()
        ));
    }
    // Every other file's objects stay.
    for f in files.iter().filter(|f| !left_out.contains(&f.as_str())) {
        for d in file_objects(f) {
            if deleted.contains(&object_id(&d)) {
                problems.push(format!("the overlay deletes {:?} of {f}", object_id(&d)));
            }
        }
    }
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    if !readme.contains(&format!("kubectl apply -k {OPENSHIFT_OVERLAY}")) {
        problems.push(format!("README.md does not say `kubectl apply -k {OPENSHIFT_OVERLAY}`"));
    }
    problems
}

/// `kubectl kustomize DIR`'s objects, by id.
fn kustomize(dir: &str) -> Option<BTreeMap<ObjectId, Value>> {
    let out = std::process::Command::new("kubectl").args(["kustomize", dir]).current_dir(repo()).output().ok()?;
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    Some(docs.into_iter().filter(|d| !d.is_null()).map(|d| (object_id(&d), d)).collect())
}

#[test]
fn openshift_overlay_is_everything_but_the_controller_and_the_crds() {
    let m = Manifests::load();
    let problems = overlay_problems(&openshift_overlay(), &m.files);
    assert!(problems.is_empty(), "{OPENSHIFT_OVERLAY}/kustomization.yaml:\n{}", problems.join("\n"));

    // What kustomize renders, where kubectl is installed: the base is every file's objects, the
    // overlay the same objects, unchanged, minus those of the two files.
    let (Some(base), Some(overlay)) = (kustomize("deploy/kubernetes"), kustomize(OPENSHIFT_OVERLAY)) else {
        eprintln!("SKIPPED: rendering with `kubectl kustomize` (no kubectl)");
        return;
    };
    let all: BTreeSet<ObjectId> = m.files.iter().flat_map(|f| file_objects(f)).map(|d| object_id(&d)).collect();
    assert_eq!(base.keys().cloned().collect::<BTreeSet<_>>(), all, "kubectl kustomize deploy/kubernetes");
    let left_out: BTreeSet<ObjectId> =
        [CONTROLLER_FILE, "00-crds.yaml"].iter().flat_map(|f| file_objects(f)).map(|d| object_id(&d)).collect();
    let expected: BTreeSet<ObjectId> = all.difference(&left_out).cloned().collect();
    assert_eq!(overlay.keys().cloned().collect::<BTreeSet<_>>(), expected, "kubectl kustomize {OPENSHIFT_OVERLAY}");
    for (id, obj) in &overlay {
        assert_eq!(Some(obj), base.get(id), "{id:?} is the base's, unchanged (image included)");
    }
}

/// Every container's `image`, at any depth (containers and initContainers of any workload).
fn images_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for key in ["containers", "initContainers"] {
                for c in o.get(key).and_then(Value::as_array).into_iter().flatten() {
                    out.push(c.get("image").and_then(Value::as_str).unwrap_or("<none>").to_string());
                }
            }
            o.values().for_each(|x| images_in(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| images_in(x, out)),
        _ => {}
    }
}

/// What `kubectl kustomize deploy/kubernetes` renders (where kubectl is installed) names the
/// image deploy/image/build.sh builds, in every container: the agent, its init container and
/// the controller.
#[test]
fn kustomize_renders_the_built_image_everywhere() {
    // (Skipped without kubectl, as the overlay's rendering above: the package script does not
    // install it; every_manifest_decodes_strictly_and_is_installed checks the same references.)
    let Some(base) = kustomize("deploy/kubernetes") else {
        eprintln!("SKIPPED: rendering with `kubectl kustomize` (no kubectl)");
        return;
    };
    let mut images = Vec::new();
    base.values().for_each(|obj| images_in(obj, &mut images));
    assert_eq!(images.len(), 3, "the agent, its init container, the controller: {images:?}");
    let want = format!("{IMAGE_NAME}:{}", env!("CARGO_PKG_VERSION"));
    assert!(images.iter().all(|i| *i == want), "every image is {want}: {images:?}");
}

/// Every check above fails on a copy of the manifests broken in the way it looks for.
#[test]
fn controller_checks_catch_mistakes() {
    let (m, good) = ControllerManifests::load();
    let agent_image = m.container().image.clone().unwrap();
    type Mutation = Box<dyn Fn(&mut ControllerManifests)>;
    #[derive(Clone, Copy, Debug)]
    enum Check {
        Rbac,
        Deployment,
        Args,
        Config,
    }
    let run = |check: Check, c: &ControllerManifests| -> Vec<String> {
        match check {
            Check::Rbac => controller_rbac_problems(c, &m.cluster_roles),
            Check::Deployment => controller_deployment_problems(c, &agent_image),
            Check::Args => controller_args_problems(c),
            Check::Config => controller_config_problems(c),
        }
    };
    fn rule(g: &str, r: &str, verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(vec![g.into()]),
            resources: Some(vec![r.into()]),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }
    }
    fn set_arg(c: &mut ControllerManifests, flag: &str, value: &str) {
        let args = c.container_mut().args.as_mut().unwrap();
        let i = args.iter().position(|a| a == flag).unwrap();
        args[i + 1] = value.into();
    }
    fn set_config(c: &mut ControllerManifests, from: &str, to: &str) {
        let data = c.config_map.data.as_mut().unwrap();
        let text = data.get_mut("controller.yaml").unwrap();
        assert!(text.contains(from), "{from}");
        *text = text.replace(from, to);
    }
    let cases: Vec<(Check, &str, &str, Mutation)> = vec![
        (
            Check::Rbac,
            "leases in the ClusterRole",
            "grants leases",
            Box::new(|c| c.cluster_role.rules.as_mut().unwrap().push(rule("coordination.k8s.io", "leases", &["get"]))),
        ),
        (
            Check::Rbac,
            "an extra verb",
            "granted but not used",
            Box::new(|c| c.cluster_role.rules.as_mut().unwrap()[0].verbs.push("delete".into())),
        ),
        (
            Check::Rbac,
            "a missing verb",
            "used but not granted",
            Box::new(|c| {
                c.cluster_role.rules.as_mut().unwrap().pop();
            }),
        ),
        (
            Check::Rbac,
            "a wildcard",
            "wildcard",
            Box::new(|c| c.cluster_role.rules.as_mut().unwrap()[0].verbs = vec!["*".into()]),
        ),
        (
            Check::Rbac,
            "a Role in another namespace",
            "the Role must be in namespace",
            Box::new(|c| c.role.metadata.namespace = Some("kube-system".into())),
        ),
        (
            Check::Rbac,
            "a Role without update",
            "NAMESPACE_RULES",
            Box::new(|c| c.role.rules.as_mut().unwrap()[0].verbs.retain(|v| v != "update")),
        ),
        (
            Check::Rbac,
            "a RoleBinding to a ClusterRole",
            "must refer to Role",
            Box::new(|c| c.role_binding.role_ref.kind = "ClusterRole".into()),
        ),
        (
            Check::Rbac,
            "a binding to another account",
            "subject must be",
            Box::new(|c| c.cluster_role_binding.subjects.as_mut().unwrap()[0].name = "default".into()),
        ),
        (
            Check::Rbac,
            "another ServiceAccount",
            "run as ServiceAccount",
            Box::new(|c| c.pod_mut().service_account_name = Some("default".into())),
        ),
        (
            Check::Deployment,
            "one replica",
            "replicas: 2",
            Box::new(|c| c.deployment.spec.as_mut().unwrap().replicas = Some(1)),
        ),
        (Check::Deployment, "the pod network", "hostNetwork: true", Box::new(|c| c.pod_mut().host_network = None)),
        (
            Check::Deployment,
            "cluster DNS",
            "dnsPolicy Default",
            Box::new(|c| c.pod_mut().dns_policy = Some("ClusterFirstWithHostNet".into())),
        ),
        (
            Check::Deployment,
            "no not-ready toleration",
            "not-ready:NoSchedule",
            Box::new(|c| {
                c.pod_mut()
                    .tolerations
                    .as_mut()
                    .unwrap()
                    .retain(|t| t.key.as_deref() != Some("node.kubernetes.io/not-ready"))
            }),
        ),
        (
            Check::Deployment,
            "evicted from not-ready nodes",
            "not-ready:NoExecute",
            Box::new(|c| c.pod_mut().tolerations.as_mut().unwrap()[0].effect = Some("NoSchedule".into())),
        ),
        (
            Check::Deployment,
            "no control-plane toleration",
            "control-plane:NoSchedule",
            Box::new(|c| {
                c.pod_mut()
                    .tolerations
                    .as_mut()
                    .unwrap()
                    .retain(|t| t.key.as_deref() != Some("node-role.kubernetes.io/control-plane"))
            }),
        ),
        (
            Check::Deployment,
            "no anti-affinity",
            "preferred pod anti-affinity",
            Box::new(|c| c.pod_mut().affinity = None),
        ),
        (
            Check::Deployment,
            "required anti-affinity",
            "preferred, not required",
            Box::new(|c| {
                let a = c.pod_mut().affinity.as_mut().unwrap().pod_anti_affinity.as_mut().unwrap();
                let term = a.preferred_during_scheduling_ignored_during_execution.as_ref().unwrap()[0]
                    .pod_affinity_term
                    .clone();
                a.required_during_scheduling_ignored_during_execution = Some(vec![term]);
            }),
        ),
        (
            Check::Deployment,
            "two at a time",
            "maxUnavailable: 1",
            Box::new(|c| {
                c.deployment
                    .spec
                    .as_mut()
                    .unwrap()
                    .strategy
                    .as_mut()
                    .unwrap()
                    .rolling_update
                    .as_mut()
                    .unwrap()
                    .max_unavailable = Some(IntOrString::Int(2))
            }),
        ),
        (
            Check::Deployment,
            "another image",
            "the image is the DaemonSet's",
            Box::new(|c| c.container_mut().image = Some("sdn-node:old".into())),
        ),
        (
            Check::Deployment,
            "the liveness probe elsewhere",
            "livenessProbe",
            Box::new(|c| {
                c.container_mut().liveness_probe.as_mut().unwrap().http_get.as_mut().unwrap().port =
                    IntOrString::Int(9104)
            }),
        ),
        (
            Check::Deployment,
            "the readiness probe on /healthz",
            "readinessProbe",
            Box::new(|c| {
                c.container_mut().readiness_probe.as_mut().unwrap().http_get.as_mut().unwrap().path =
                    Some("/healthz".into())
            }),
        ),
        (
            Check::Deployment,
            "the health port on every address",
            "--health-addr 127.0.0.1:9103",
            Box::new(|c| set_arg(c, "--health-addr", "0.0.0.0:9103")),
        ),
        (
            Check::Deployment,
            "the port undeclared",
            "declared as a host port",
            Box::new(|c| c.container_mut().ports = None),
        ),
        (
            Check::Deployment,
            "root",
            "runAsNonRoot",
            Box::new(|c| c.container_mut().security_context.as_mut().unwrap().run_as_non_root = Some(false)),
        ),
        (
            Check::Deployment,
            "UID 0",
            "non-root UID",
            Box::new(|c| c.container_mut().security_context.as_mut().unwrap().run_as_user = Some(0)),
        ),
        (
            Check::Deployment,
            "a capability",
            "no capability added",
            Box::new(|c| {
                c.container_mut().security_context.as_mut().unwrap().capabilities.as_mut().unwrap().add =
                    Some(vec!["NET_ADMIN".into()])
            }),
        ),
        (
            Check::Deployment,
            "escalation",
            "allowPrivilegeEscalation",
            Box::new(|c| c.container_mut().security_context.as_mut().unwrap().allow_privilege_escalation = None),
        ),
        (
            Check::Deployment,
            "a writable root",
            "readOnlyRootFilesystem",
            Box::new(|c| c.container_mut().security_context.as_mut().unwrap().read_only_root_filesystem = Some(false)),
        ),
        (
            Check::Deployment,
            "unconfined seccomp",
            "seccomp",
            Box::new(|c| {
                c.container_mut().security_context.as_mut().unwrap().seccomp_profile.as_mut().unwrap().type_ =
                    "Unconfined".into()
            }),
        ),
        (
            Check::Deployment,
            "no memory limit",
            "memory request",
            Box::new(|c| c.container_mut().resources.as_mut().unwrap().limits = None),
        ),
        (
            Check::Deployment,
            "the identity from the node",
            "--identity",
            Box::new(|c| {
                let env = c.container_mut().env.as_mut().unwrap();
                env[0].value_from.as_mut().unwrap().field_ref.as_mut().unwrap().field_path = "spec.nodeName".into();
            }),
        ),
        (
            Check::Deployment,
            "the ConfigMap elsewhere",
            "mounted read-only",
            Box::new(|c| c.container_mut().volume_mounts.as_mut().unwrap()[0].mount_path = "/etc/other".into()),
        ),
        (
            Check::Args,
            "a misspelt flag",
            "not a flag of `sdn-node controller`",
            Box::new(|c| c.container_mut().args.as_mut().unwrap().push("--leader-elect".into())),
        ),
        (
            Check::Args,
            "a bad value",
            "did not get past",
            Box::new(|c| c.container_mut().args.as_mut().unwrap().extend(["--kube-api-qps".into(), "0".into()])),
        ),
        (
            Check::Args,
            "a misspelt key",
            "did not get past",
            Box::new(|c| set_config(c, "hostSubnetLength", "hostSubnetLen")),
        ),
        (
            Check::Config,
            "a misspelt key",
            "refuses the ConfigMap",
            Box::new(|c| set_config(c, "clusterNetwork", "clusterNetwrk")),
        ),
        (
            Check::Config,
            "overlapping networks",
            "refuses the ConfigMap",
            Box::new(|c| set_config(c, "172.30.0.0/16", "10.128.0.0/16")),
        ),
        (
            Check::Config,
            "openshift-sdn's /23",
            "kubeadm's Nodes get /24",
            Box::new(|c| set_config(c, "hostSubnetLength: 8", "hostSubnetLength: 9")),
        ),
        (
            Check::Config,
            "another cluster network",
            "differ from README",
            Box::new(|c| set_config(c, "10.128.0.0/14", "10.0.0.0/14")),
        ),
        (
            Check::Config,
            "multitenant",
            "plugin",
            Box::new(|c| set_config(c, "plugin: networkpolicy", "plugin: multitenant")),
        ),
        (Check::Config, "another MTU", "mtu", Box::new(|c| set_config(c, "mtu: 1450", "mtu: 1400"))),
    ];
    for check in [Check::Rbac, Check::Deployment, Check::Args, Check::Config] {
        let problems = run(check, &good);
        assert!(problems.is_empty(), "{check:?} fails on the real manifests: {problems:?}");
    }
    for (check, what, expected, mutate) in &cases {
        let mut broken = good.clone();
        mutate(&mut broken);
        let problems = run(*check, &broken);
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "{check:?} does not catch {what} (expected a problem containing {expected:?}): {problems:?}"
        );
    }
    // The overlay's check: a deletion missing, or one too many.
    let overlay = openshift_overlay();
    let mut broken = overlay.clone();
    broken.patches.retain(|p| !p.patch.contains("kind: Deployment"));
    assert!(overlay_problems(&broken, &m.files).iter().any(|p| p.contains("should delete")), "a missing deletion");
    let mut broken = overlay.clone();
    broken.patches.push(OverlayPatch {
        patch:
            "$patch: delete\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: sdn-node, namespace: sdn-node}\n"
                .into(),
    });
    assert!(
        overlay_problems(&broken, &m.files).iter().any(|p| p.contains("deletes but should not")),
        "an extra deletion"
    );
    let mut broken = overlay;
    broken.resources = vec!["../kubernetes/04-daemonset.yaml".into()];
    assert!(!overlay_problems(&broken, &m.files).is_empty(), "a file outside the overlay");
}
