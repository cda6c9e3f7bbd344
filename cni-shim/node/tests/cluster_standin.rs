//! The stateful stand-in for the Kubernetes API server (`common::cluster`) against the real
//! kube client: lists with selectors, watches (kube's `Api::watch` and `kube::runtime`'s
//! watcher), deletes with preconditions, patches of pods, their status and nodes, events,
//! and the stand-in's own helpers. Each test checks what the server stored, not only that the
//! client was answered.

use cni_testkit as common;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::pki::TOKEN;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::ResourceExt;
use serde_json::{json, Value};

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.proxy_url = None;
    kube::Client::try_from(config).unwrap()
}

fn pod(ns: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running"},
    })
}

/// The code of the API error `r` is, or a panic.
fn code<T: std::fmt::Debug>(r: kube::Result<T>) -> u16 {
    match r {
        Err(kube::Error::Api(e)) => e.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect()
}

/// A `Patch::Json` (RFC 6902) of these operations.
fn json_ops(ops: Value) -> Patch<Value> {
    Patch::Json(serde_json::from_value(ops).unwrap())
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Lists

#[test]
fn a_list_with_selectors_returns_only_the_matching_pods() {
    let c = Cluster::start();
    c.put_pod(pod("default", "a1", "node-a"));
    c.put_pod(pod("bookinfo", "a2", "node-a"));
    c.put_pod(pod("default", "b1", "node-b"));
    let mut pending = pod("default", "p1", "");
    pending["spec"].as_object_mut().unwrap().remove("nodeName");
    pending["metadata"]["labels"]["tier"] = "web".into();
    c.put_pod(pending);

    block_on(async {
        let client = client(c.kubeconfig()).await;
        let all: Api<Pod> = Api::all(client.clone());
        let on_a = all
            .list(&ListParams::default().fields("spec.nodeName=node-a"))
            .await
            .unwrap();
        assert_eq!(names(&on_a.items), ["bookinfo/a2", "default/a1"]);
        assert_eq!(
            on_a.metadata.resource_version,
            Some(c.resource_version().to_string())
        );
        let not_a = all
            .list(&ListParams::default().fields("spec.nodeName!=node-a"))
            .await
            .unwrap();
        assert_eq!(names(&not_a.items), ["default/b1", "default/p1"]);
        // A missing field is "".
        let unscheduled = all
            .list(&ListParams::default().fields("spec.nodeName==,status.phase=Running"))
            .await
            .unwrap();
        assert_eq!(names(&unscheduled.items), ["default/p1"]);

        let default: Api<Pod> = Api::namespaced(client.clone(), "default");
        let everything = default.list(&ListParams::default()).await.unwrap();
        assert_eq!(
            names(&everything.items),
            ["default/a1", "default/b1", "default/p1"]
        );
        let labelled = default
            .list(&ListParams::default().labels("app in (a1, b1, a2),!tier"))
            .await
            .unwrap();
        assert_eq!(names(&labelled.items), ["default/a1", "default/b1"]);
        let web = default
            .list(&ListParams::default().labels("tier,app!=a1"))
            .await
            .unwrap();
        assert_eq!(names(&web.items), ["default/p1"]);
        let both = default
            .list(
                &ListParams::default()
                    .labels("app==b1")
                    .fields("metadata.namespace=default"),
            )
            .await
            .unwrap();
        assert_eq!(names(&both.items), ["default/b1"]);

        // As the API server, a field it cannot select on is a bad request.
        let unsupported = all
            .list(&ListParams::default().fields("spec.containers=app"))
            .await;
        assert_eq!(code(unsupported), 400);
    });

    let requests = c.requests();
    assert_eq!(requests.len(), 8, "{requests:#?}");
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].path, "/api/v1/pods");
    assert!(
        requests[0]
            .query
            .contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "{}",
        requests[0].query
    );
    assert_eq!(
        requests[0].param("fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(requests[3].path, "/api/v1/namespaces/default/pods");
}

// ---------------------------------------------------------------------------------------------
// Watches

/// The next event that is not a bookmark, within 5 s.
async fn next<S>(stream: &mut S) -> WatchEvent<Pod>
where
    S: futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin,
{
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("no event within 5 s")
            .expect("the watch ended")
            .expect("a watch error");
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return event;
        }
    }
}

fn described(e: &WatchEvent<Pod>) -> String {
    match e {
        WatchEvent::Added(p) => format!("ADDED {}", p.name_any()),
        WatchEvent::Modified(p) => format!("MODIFIED {}", p.name_any()),
        WatchEvent::Deleted(p) => format!("DELETED {}", p.name_any()),
        WatchEvent::Bookmark(b) => format!("BOOKMARK {}", b.metadata.resource_version),
        WatchEvent::Error(e) => format!("ERROR {}", e.code),
    }
}

#[test]
fn a_watch_from_a_list_sees_every_later_change_that_matches() {
    let c = Cluster::start();
    c.put_pod(pod("default", "a1", "node-a"));
    c.put_pod(pod("default", "b1", "node-b"));

    block_on(async {
        let api: Api<Pod> = Api::all(client(c.kubeconfig()).await);
        let list = api
            .list(&ListParams::default().fields("spec.nodeName=node-a"))
            .await
            .unwrap();
        let version = list.metadata.resource_version.unwrap();
        assert_eq!(names(&list.items), ["default/a1"]);

        // Between the list and the watch: not lost.
        c.put_pod(pod("default", "a2", "node-a"));
        c.put_pod(pod("other", "b2", "node-b"));
        let wp = WatchParams::default().fields("spec.nodeName=node-a");
        let mut w = api.watch(&wp, &version).await.unwrap().boxed();
        let added = next(&mut w).await;
        assert_eq!(described(&added), "ADDED a2");

        // A modification.
        let mut a1 = c.pod("default", "a1").unwrap();
        a1["metadata"]["labels"]["repair"] = "pending".into();
        let stored = c.put_pod(a1);
        match next(&mut w).await {
            WatchEvent::Modified(p) => {
                assert_eq!(p.name_any(), "a1");
                assert_eq!(p.labels()["repair"], "pending");
                assert_eq!(p.resource_version().unwrap(), rv(&stored).to_string());
                assert_eq!(
                    p.uid().unwrap(),
                    stored["metadata"]["uid"].as_str().unwrap()
                );
            }
            other => panic!("expected MODIFIED a1, got {}", described(&other)),
        }

        // A pod that comes to node-a is added, one that leaves it deleted.
        let mut b1 = c.pod("default", "b1").unwrap();
        b1["spec"]["nodeName"] = "node-a".into();
        c.put_pod(b1);
        assert_eq!(described(&next(&mut w).await), "ADDED b1");
        let mut a2 = c.pod("default", "a2").unwrap();
        a2["spec"]["nodeName"] = "node-c".into();
        c.put_pod(a2);
        assert_eq!(described(&next(&mut w).await), "DELETED a2");

        // A deletion, with the version of the deletion.
        c.remove_pod("default", "a1");
        match next(&mut w).await {
            WatchEvent::Deleted(p) => {
                assert_eq!(p.name_any(), "a1");
                assert_eq!(
                    p.resource_version().unwrap(),
                    c.resource_version().to_string()
                );
            }
            other => panic!("expected DELETED a1, got {}", described(&other)),
        }
        assert!(c.pod("default", "a1").is_none());

        // A namespaced watch from "0" starts now and sees its namespace only.
        let other: Api<Pod> = Api::namespaced(api.clone().into_client(), "other");
        let mut wo = other
            .watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        c.put_pod(pod("default", "d9", "node-a"));
        c.put_pod(pod("other", "o1", "node-a"));
        assert_eq!(described(&next(&mut wo).await), "ADDED o1");
        assert_eq!(described(&next(&mut w).await), "ADDED d9");
        assert_eq!(described(&next(&mut w).await), "ADDED o1");
    });

    let watches: Vec<_> = c.requests().into_iter().filter(|r| r.is_watch()).collect();
    assert_eq!(watches.len(), 2);
    assert_eq!(
        watches[0].param("fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(watches[1].path, "/api/v1/namespaces/other/pods");
}

#[test]
fn a_watch_ends_at_its_timeout_and_when_the_cluster_is_dropped() {
    let c = Cluster::start();
    let kubeconfig = c.kubeconfig().to_owned();
    let dir = tempfile::tempdir().unwrap();
    // The cluster's directory goes with it; the client keeps its own copy.
    let copy = dir.path().join("kubeconfig");
    std::fs::copy(&kubeconfig, &copy).unwrap();
    let mut c = Some(c);

    block_on(async {
        let api: Api<Pod> = Api::all(client(&copy).await);
        let started = Instant::now();
        let mut w = api
            .watch(&WatchParams::default().timeout(1), "0")
            .await
            .unwrap()
            .boxed();
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(e) = w.next().await {
                e.unwrap();
            }
        })
        .await;
        assert!(ended.is_ok(), "the watch did not end at its timeout");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(900), "ended after {took:?}");

        let mut w = api
            .watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        c.as_ref().unwrap().put_pod(pod("default", "a1", "node-a"));
        assert_eq!(described(&next(&mut w).await), "ADDED a1");
        let started = Instant::now();
        drop(c.take());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the drop waited {:?} for the watch",
            started.elapsed()
        );
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(e) = w.next().await {
                e.unwrap();
            }
        })
        .await;
        assert!(ended.is_ok(), "the watch outlived the cluster");
        // And the server is gone.
        assert!(api.list(&ListParams::default()).await.is_err());
    });
}

/// kube's own watcher with its default configuration, then with streaming lists, then after a
/// compaction (410 Expired: it lists again).
#[test]
fn kube_runtime_watcher_lists_then_watches() {
    use kube::runtime::watcher::{self, Event as Seen};

    let c = Cluster::start();
    c.put_pod(pod("default", "a1", "node-a"));
    c.put_pod(pod("default", "b1", "node-b"));

    fn seen(e: &kube::runtime::watcher::Result<Seen<Pod>>) -> String {
        match e {
            Ok(Seen::Init) => "Init".into(),
            Ok(Seen::InitApply(p)) => format!("InitApply {}", p.name_any()),
            Ok(Seen::InitDone) => "InitDone".into(),
            Ok(Seen::Apply(p)) => format!("Apply {}", p.name_any()),
            Ok(Seen::Delete(p)) => format!("Delete {}", p.name_any()),
            Err(watcher::Error::WatchError(e)) => format!("WatchError {}", e.code),
            Err(e) => format!("Err {e}"),
        }
    }
    async fn take<S>(w: &mut S, n: usize) -> Vec<String>
    where
        S: futures_util::Stream<Item = kube::runtime::watcher::Result<Seen<Pod>>> + Unpin,
    {
        let mut out = Vec::new();
        while out.len() < n {
            let e = tokio::time::timeout(Duration::from_secs(10), w.next())
                .await
                .unwrap_or_else(|_| panic!("after {out:?}: nothing within 10 s"))
                .expect("the watcher ended");
            out.push(seen(&e));
        }
        out
    }

    block_on(async {
        let api: Api<Pod> = Api::all(client(c.kubeconfig()).await);

        // The default: a list (pages of 500), then a watch from its version.
        let config = watcher::Config::default().fields("spec.nodeName=node-a");
        let mut w = watcher::watcher(api.clone(), config).boxed();
        assert_eq!(take(&mut w, 3).await, ["Init", "InitApply a1", "InitDone"]);
        c.put_pod(pod("default", "a2", "node-a"));
        c.put_pod(pod("default", "b2", "node-b"));
        c.remove_pod("default", "a1");
        assert_eq!(take(&mut w, 2).await, ["Apply a2", "Delete a1"]);
        drop(w);

        // Streaming lists: one watch, the objects, then the bookmark that ends them (kube
        // 2.0.1 sends no Init for a streaming list).
        let config = watcher::Config::default()
            .fields("spec.nodeName=node-a")
            .streaming_lists();
        let mut w = watcher::watcher(api.clone(), config).boxed();
        assert_eq!(take(&mut w, 2).await, ["InitApply a2", "InitDone"]);
        c.remove_pod("default", "a2");
        assert_eq!(take(&mut w, 1).await, ["Delete a2"]);
        drop(w);

        // Watches of one second; the history is compacted under one: it lists again.
        c.put_pod(pod("default", "a3", "node-a"));
        let config = watcher::Config::default()
            .fields("spec.nodeName=node-a")
            .timeout(1);
        let mut w = watcher::watcher(api.clone(), config).boxed();
        assert_eq!(take(&mut w, 3).await, ["Init", "InitApply a3", "InitDone"]);
        c.put_pod(pod("default", "b3", "node-b"));
        c.compact();
        assert_eq!(
            take(&mut w, 4).await,
            ["WatchError 410", "Init", "InitApply a3", "InitDone"]
        );
    });

    let requests = c.requests();
    let first_list = &requests[0];
    assert!(!first_list.is_watch());
    assert_eq!(first_list.path, "/api/v1/pods");
    assert_eq!(first_list.param("limit").as_deref(), Some("500"));
    assert_eq!(first_list.param("resourceVersion"), None);
    assert_eq!(
        first_list.param("fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    let first_watch = &requests[1];
    assert!(first_watch.is_watch());
    assert_eq!(
        first_watch.param("allowWatchBookmarks").as_deref(),
        Some("true")
    );
    assert_eq!(first_watch.param("timeoutSeconds").as_deref(), Some("290"));
    assert_eq!(first_watch.param("resourceVersion").as_deref(), Some("2"));
    let streaming = requests
        .iter()
        .find(|r| r.param("sendInitialEvents").is_some())
        .expect("a streaming list");
    assert!(streaming.is_watch());
    assert_eq!(
        streaming.param("sendInitialEvents").as_deref(),
        Some("true")
    );
    assert_eq!(
        streaming.param("resourceVersionMatch").as_deref(),
        Some("NotOlderThan")
    );
    assert_eq!(streaming.param("resourceVersion").as_deref(), Some("0"));
}

// ---------------------------------------------------------------------------------------------
// Deletes

#[test]
fn a_delete_with_preconditions_needs_the_current_uid_and_version() {
    let c = Cluster::start();
    let first = c.put_pod(pod("default", "a1", "node-a"));
    let uid = first["metadata"]["uid"].as_str().unwrap().to_owned();
    let mut changed = first.clone();
    changed["metadata"]["labels"]["x"] = "y".into();
    let current = c.put_pod(changed);
    assert_eq!(current["metadata"]["uid"], uid, "the uid is kept");
    let stale = rv(&first).to_string();
    let fresh = rv(&current).to_string();

    block_on(async {
        let api: Api<Pod> = Api::namespaced(client(c.kubeconfig()).await, "default");
        let with = |uid: &str, rv: &str| DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
            }),
            ..DeleteParams::default()
        };
        assert_eq!(code(api.delete("a1", &with(&uid, &stale)).await), 409);
        assert!(c.pod("default", "a1").is_some());
        assert_eq!(
            code(
                api.delete("a1", &with("11111111-0000-0000-0000-000000000000", &fresh))
                    .await
            ),
            409
        );
        assert!(c.pod("default", "a1").is_some());
        let dry = DeleteParams {
            dry_run: true,
            ..with(&uid, &fresh)
        };
        api.delete("a1", &dry).await.unwrap();
        assert!(c.pod("default", "a1").is_some(), "a dry run deleted");

        let deleted = api.delete("a1", &with(&uid, &fresh)).await.unwrap();
        let deleted = deleted.left().expect("the deleted pod");
        assert_eq!(deleted.name_any(), "a1");
        assert_eq!(deleted.uid().unwrap(), uid);
        assert!(c.pod("default", "a1").is_none());
        assert_eq!(code(api.delete("a1", &DeleteParams::default()).await), 404);
    });

    let deletes: Vec<_> = c
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 5);
    let body: Value = serde_json::from_str(&deletes[0].body).unwrap();
    assert_eq!(body["preconditions"]["resourceVersion"], stale);
    assert_eq!(body["preconditions"]["uid"], uid);
}

// ---------------------------------------------------------------------------------------------
// Patches

#[test]
fn patches_of_a_pod_and_its_status() {
    let c = Cluster::start();
    let before = c.put_pod(pod("default", "a1", "node-a"));

    block_on(async {
        let api: Api<Pod> = Api::namespaced(client(c.kubeconfig()).await, "default");
        let pp = PatchParams::default();

        // The status endpoint: labels and the status change, the spec does not.
        let patched = api
            .patch_status(
                "a1",
                &pp,
                &Patch::Merge(json!({
                    "metadata": {"labels": {"repair": "done"}},
                    "spec": {"nodeName": "elsewhere"},
                    "status": {"phase": "Failed", "reason": "Broken"},
                })),
            )
            .await
            .unwrap();
        assert_eq!(patched.labels()["repair"], "done");
        let stored = c.pod("default", "a1").unwrap();
        assert_eq!(stored["metadata"]["labels"]["repair"], "done");
        assert_eq!(
            stored["metadata"]["labels"]["app"], "a1",
            "merged, not replaced"
        );
        assert_eq!(stored["status"]["phase"], "Failed");
        assert_eq!(stored["spec"]["nodeName"], "node-a");
        assert_eq!(rv(&stored), rv(&before) + 1);
        assert_eq!(patched.resource_version().unwrap(), rv(&stored).to_string());

        // The object's endpoint: the status does not change.
        api.patch(
            "a1",
            &pp,
            &Patch::Merge(
                json!({"metadata": {"annotations": {"a": "b"}}, "status": {"phase": "Running"}}),
            ),
        )
        .await
        .unwrap();
        let stored = c.pod("default", "a1").unwrap();
        assert_eq!(stored["metadata"]["annotations"]["a"], "b");
        assert_eq!(stored["status"]["phase"], "Failed");

        // A stale version is a conflict and changes nothing.
        let stale = Patch::Merge(json!({"metadata": {
            "resourceVersion": rv(&before).to_string(),
            "labels": {"repair": "again"}}}));
        assert_eq!(code(api.patch_status("a1", &pp, &stale).await), 409);
        assert_eq!(c.pod("default", "a1").unwrap(), stored);
        // The current one is fine; a null removes.
        let current = Patch::Merge(json!({"metadata": {
            "resourceVersion": rv(&stored).to_string(),
            "labels": {"repair": null}}}));
        api.patch_status("a1", &pp, &current).await.unwrap();
        let stored = c.pod("default", "a1").unwrap();
        assert!(stored["metadata"]["labels"].get("repair").is_none());

        // A patch that changes nothing makes no new version.
        let same = api
            .patch(
                "a1",
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {"app": "a1"}}})),
            )
            .await
            .unwrap();
        assert_eq!(same.resource_version().unwrap(), rv(&stored).to_string());
        assert_eq!(c.resource_version(), rv(&stored));

        // JSON patches: a failed test is 422 (as the API server answers it), and nothing
        // changes; a passing one applies the rest.
        let version = rv(&stored).to_string();
        let failing = json_ops(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "add", "path": "/metadata/labels/x", "value": "y"},
        ]));
        assert_eq!(code(api.patch("a1", &pp, &failing).await), 422);
        assert_eq!(c.pod("default", "a1").unwrap(), stored);
        let passing = json_ops(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/metadata/labels/x~1y", "value": "z"},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "app:2"},
            {"op": "remove", "path": "/metadata/annotations/a"},
        ]));
        api.patch("a1", &pp, &passing).await.unwrap();
        let stored = c.pod("default", "a1").unwrap();
        assert_eq!(stored["metadata"]["labels"]["x/y"], "z");
        assert_eq!(stored["spec"]["containers"][0]["image"], "app:2");
        assert!(stored["metadata"]["annotations"].get("a").is_none());
        // Removing what is not there fails.
        let missing = json_ops(json!([{"op": "remove", "path": "/metadata/labels/nope"}]));
        assert_eq!(code(api.patch("a1", &pp, &missing).await), 422);

        // Strategic merge is taken as a merge.
        api.patch(
            "a1",
            &pp,
            &Patch::Strategic(json!({"metadata": {"labels": {"s": "m"}}})),
        )
        .await
        .unwrap();
        assert_eq!(
            c.pod("default", "a1").unwrap()["metadata"]["labels"]["s"],
            "m"
        );

        assert_eq!(
            code(api.patch("gone", &pp, &Patch::Merge(json!({}))).await),
            404
        );
    });

    let requests = c.requests();
    let status = &requests[0];
    assert_eq!(status.method, "PATCH");
    assert_eq!(status.path, "/api/v1/namespaces/default/pods/a1/status");
    assert_eq!(
        status.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let body: Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(body["metadata"]["labels"]["repair"], "done");
    assert!(requests
        .iter()
        .any(|r| r.content_type.as_deref() == Some("application/json-patch+json")));
}

#[test]
fn patches_of_a_node() {
    let c = Cluster::start();
    let before = c.put_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}},
        "spec": {"taints": [{"key": "repair", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }));
    c.put_node(json!({"metadata": {"name": "node-b"}}));

    block_on(async {
        let nodes: Api<Node> = Api::all(client(c.kubeconfig()).await);
        let pp = PatchParams::default();
        let node = nodes.get("node-a").await.unwrap();
        assert_eq!(node.labels()["kubernetes.io/hostname"], "node-a");
        let listed = nodes
            .list(&ListParams::default().fields("metadata.name=node-b"))
            .await
            .unwrap();
        assert_eq!(listed.items.len(), 1);
        assert_eq!(listed.items[0].name_any(), "node-b");

        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"metadata": {
                    "resourceVersion": rv(&before).to_string(),
                    "labels": {"repair.example/ready": "true"}}})),
            )
            .await
            .unwrap();
        let stored = c.node("node-a").unwrap();
        assert_eq!(stored["metadata"]["labels"]["repair.example/ready"], "true");
        assert_eq!(
            stored["metadata"]["labels"]["kubernetes.io/hostname"],
            "node-a"
        );

        // The old version again: a conflict.
        let stale = Patch::Merge(json!({"metadata": {
            "resourceVersion": rv(&before).to_string(), "labels": {"x": "y"}}}));
        assert_eq!(code(nodes.patch("node-a", &pp, &stale).await), 409);
        // A JSON patch guarded by the version.
        let stale = json_ops(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv(&before).to_string()},
            {"op": "remove", "path": "/spec/taints/0"},
        ]));
        assert_eq!(code(nodes.patch("node-a", &pp, &stale).await), 422);
        assert_eq!(c.node("node-a").unwrap(), stored);
        let fresh = json_ops(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv(&stored).to_string()},
            {"op": "remove", "path": "/spec/taints/0"},
        ]));
        nodes.patch("node-a", &pp, &fresh).await.unwrap();
        let stored = c.node("node-a").unwrap();
        assert_eq!(stored["spec"]["taints"], json!([]));
        assert_eq!(stored["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(code(nodes.get("node-z").await), 404);
    });

    let patches: Vec<_> = c
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(patches.len(), 4);
    assert!(patches.iter().all(|r| r.path == "/api/v1/nodes/node-a"));
}

#[test]
fn create_replace_and_evict() {
    let c = Cluster::start();
    block_on(async {
        let api: Api<Pod> = Api::namespaced(client(c.kubeconfig()).await, "default");
        let pp = PostParams::default();
        let p: Pod = serde_json::from_value(pod("ignored", "a1", "node-a")).unwrap();
        // The namespace of the path is the pod's, as for the API server.
        assert_eq!(code(api.create(&pp, &p).await), 400);
        let p: Pod = serde_json::from_value(pod("default", "a1", "node-a")).unwrap();
        let created = api.create(&pp, &p).await.unwrap();
        let stored = c.pod("default", "a1").unwrap();
        assert_eq!(
            created.uid().unwrap(),
            stored["metadata"]["uid"].as_str().unwrap()
        );
        assert!(stored["metadata"]["creationTimestamp"].is_string());
        assert_eq!(code(api.create(&pp, &p).await), 409);

        // Replace: by the current version only, and the status stays.
        let mut changed = created.clone();
        changed.labels_mut().insert("x".into(), "y".into());
        changed.status.as_mut().unwrap().phase = Some("Failed".into());
        let replaced = api.replace("a1", &pp, &changed).await.unwrap();
        assert_eq!(replaced.labels()["x"], "y");
        let stored = c.pod("default", "a1").unwrap();
        assert_eq!(stored["metadata"]["labels"]["x"], "y");
        assert_eq!(stored["status"]["phase"], "Running");
        assert_eq!(code(api.replace("a1", &pp, &changed).await), 409);
        // The status subresource takes the status.
        let mut status = replaced.clone();
        status.status.as_mut().unwrap().phase = Some("Failed".into());
        let body = serde_json::to_vec(&status).unwrap();
        api.replace_status("a1", &pp, body).await.unwrap();
        assert_eq!(c.pod("default", "a1").unwrap()["status"]["phase"], "Failed");

        // An eviction deletes.
        api.evict("a1", &kube::api::EvictParams::default())
            .await
            .unwrap();
        assert!(c.pod("default", "a1").is_none());

        // A pod put again under the same name with another uid is another pod to a watch.
        let first = c.put_pod(pod("default", "b1", "node-a"));
        let mut w = api
            .watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        let mut again = pod("default", "b1", "node-a");
        again["metadata"]["uid"] = "another-uid".into();
        c.put_pod(again);
        match next(&mut w).await {
            WatchEvent::Deleted(p) => {
                assert_eq!(p.uid().unwrap(), first["metadata"]["uid"].as_str().unwrap())
            }
            other => panic!("expected DELETED b1, got {}", described(&other)),
        }
        match next(&mut w).await {
            WatchEvent::Added(p) => assert_eq!(p.uid().unwrap(), "another-uid"),
            other => panic!("expected ADDED b1, got {}", described(&other)),
        }
    });
    let evictions: Vec<_> = c
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .collect();
    assert_eq!(evictions.len(), 1);
    assert_eq!(evictions[0].method, "POST");
}

// ---------------------------------------------------------------------------------------------
// Events

#[test]
fn events_are_recorded_in_order() {
    let c = Cluster::start();
    block_on(async {
        let client = client(c.kubeconfig()).await;
        let core: Api<Event> = Api::namespaced(client.clone(), "bookinfo");
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some("reviews-0.".into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some("reviews-0".into()),
                namespace: Some("bookinfo".into()),
                ..ObjectReference::default()
            },
            reason: Some("PodRepaired".into()),
            message: Some("the pod's network was repaired".into()),
            type_: Some("Normal".into()),
            ..Event::default()
        };
        let created = core.create(&PostParams::default(), &event).await.unwrap();
        let name = created.name_any();
        assert!(name.starts_with("reviews-0.") && name.len() > 10, "{name}");
        assert_eq!(created.namespace().as_deref(), Some("bookinfo"));

        use k8s_openapi::api::events::v1::Event as EventV1;
        let v1: Api<EventV1> = Api::namespaced(client.clone(), "bookinfo");
        let event = EventV1 {
            metadata: ObjectMeta {
                name: Some("reviews-0.17f0".into()),
                ..ObjectMeta::default()
            },
            reason: Some("PodDeleted".into()),
            action: Some("Delete".into()),
            reporting_controller: Some("redirect-cni/repair".into()),
            reporting_instance: Some("node-a".into()),
            event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::chrono::DateTime::UNIX_EPOCH,
            )),
            ..EventV1::default()
        };
        v1.create(&PostParams::default(), &event).await.unwrap();
        assert_eq!(code(v1.create(&PostParams::default(), &event).await), 409);
        // As kube's Recorder counts a series.
        v1.patch(
            "reviews-0.17f0",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"series": {"count": 2, "lastObservedTime": "2025-01-01T00:00:00.000000Z"}}),
            ),
        )
        .await
        .unwrap();
    });

    let events = c.events();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["kind"], "Event");
    assert_eq!(events[0]["apiVersion"], "v1");
    assert_eq!(events[0]["reason"], "PodRepaired");
    assert_eq!(events[0]["involvedObject"]["name"], "reviews-0");
    assert_eq!(events[1]["apiVersion"], "events.k8s.io/v1");
    assert_eq!(events[1]["reason"], "PodDeleted");
    assert_eq!(events[1]["metadata"]["namespace"], "bookinfo");
    assert_eq!(events[1]["series"]["count"], 2);
    let posts: Vec<_> = c
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.path)
        .collect();
    assert_eq!(
        posts,
        [
            "/api/v1/namespaces/bookinfo/events",
            "/apis/events.k8s.io/v1/namespaces/bookinfo/events",
            "/apis/events.k8s.io/v1/namespaces/bookinfo/events",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// The stand-in's own behaviour

#[test]
fn a_wrong_token_is_unauthorized_and_failures_come_as_asked() {
    let c = Cluster::start();
    c.put_pod(pod("default", "a1", "node-a"));
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("kubeconfig");
    let text = std::fs::read_to_string(c.kubeconfig()).unwrap();
    assert!(text.contains(TOKEN) && text.contains(&c.url()));
    std::fs::write(&wrong, text.replace(TOKEN, "not-the-token")).unwrap();

    block_on(async {
        let stranger: Api<Pod> = Api::namespaced(client(&wrong).await, "default");
        assert_eq!(code(stranger.get("a1").await), 401);

        let client = client(c.kubeconfig()).await;
        let api: Api<Pod> = Api::namespaced(client.clone(), "default");
        c.fail_next("GET", "/api/v1/namespaces/default/pods/a1", 503, 2);
        assert_eq!(code(api.get("a1").await), 503);
        assert_eq!(code(api.get("a1").await), 503);
        assert_eq!(api.get("a1").await.unwrap().name_any(), "a1");

        c.fail_next("*", "/api/v1/pods", 500, 1);
        let all: Api<Pod> = Api::all(client.clone());
        assert_eq!(code(all.list(&ListParams::default()).await), 500);
        assert_eq!(
            all.list(&ListParams::default()).await.unwrap().items.len(),
            1
        );

        let config_maps: Api<ConfigMap> = Api::namespaced(client, "default");
        assert_eq!(code(config_maps.get("settings").await), 404);
    });

    let requests = c.requests();
    let lines: Vec<String> = requests
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        lines,
        [
            "GET /api/v1/namespaces/default/pods/a1",
            "GET /api/v1/namespaces/default/pods/a1",
            "GET /api/v1/namespaces/default/pods/a1",
            "GET /api/v1/namespaces/default/pods/a1",
            "GET /api/v1/pods",
            "GET /api/v1/pods",
            "GET /api/v1/namespaces/default/configmaps/settings",
        ]
    );
}

#[test]
fn wait_for_returns_what_comes() {
    let c = std::sync::Arc::new(Cluster::start());
    let c2 = c.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        c2.put_pod(pod("default", "late", "node-a"));
    });
    let p = c.wait_for(Duration::from_secs(5), "the late pod", |c| {
        c.pod("default", "late")
    });
    assert_eq!(p["metadata"]["name"], "late");
    t.join().unwrap();
}

#[test]
#[should_panic(expected = "waiting for a pod that never comes")]
fn wait_for_names_what_never_came() {
    let c = Cluster::start();
    c.wait_for(Duration::from_millis(100), "a pod that never comes", |c| {
        c.pod("default", "never")
    });
}
