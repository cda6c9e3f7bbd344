//! `node`: the node agent's view of every pod on its node (`GET /debug/node` on its monitoring
//! port, or a saved copy), as a table an operator reads at a glance: the pods that need
//! attention first, each with its capture (sidecar or ambient), its state, its rules as last
//! read back and when, its last repair and why, and what ztunnel acked on which connection.
//!
//! The agent listens on the node's loopback (or the pod's address): one plain HTTP/1.1 GET,
//! written here in a few lines rather than linking an HTTP client into a static probe.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use clap::{Arg, ArgAction, Command};
use redirect_program::logging::stderr_line;
use serde_json::Value;

use crate::{EXIT_DIFFERS, EXIT_ERROR, EXIT_OK};

const ABOUT: &str = "Shows the node agent's view of every pod on its node (GET /debug/node on its monitoring port): the pods that need attention first; exit 2 when one does";
/// The agent's monitoring port on the node (the chart's).
const DEFAULT_AGENT: &str = "http://127.0.0.1:15014";

pub fn main(args: Vec<OsString>) -> i32 {
    let cmd = Command::new("redirect-validate node")
        .about(ABOUT)
        .arg(Arg::new("agent").long("agent").value_name("URL").help(
            "The agent's monitoring address (http://HOST:PORT) [default: http://127.0.0.1:15014]",
        ))
        .arg(
            Arg::new("file")
                .long("file")
                .value_name("FILE")
                .conflicts_with("agent")
                .help("Read a saved copy of /debug/node instead (e.g. from kubectl exec ... curl)"),
        )
        .arg(
            Arg::new("json")
                .long("json")
                .action(ArgAction::SetTrue)
                .help("Print the agent's JSON as it came"),
        );
    let m = match cmd.try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_ERROR } else { EXIT_OK };
        }
    };
    let text = match m.get_one::<String>("file") {
        Some(f) => std::fs::read_to_string(f).map_err(|e| format!("--file {f}: {e}")),
        None => {
            let agent = m
                .get_one::<String>("agent")
                .map(String::as_str)
                .unwrap_or(DEFAULT_AGENT);
            fetch(agent)
        }
    };
    let text = match text {
        Ok(t) => t,
        Err(msg) => {
            stderr_line("error", &msg);
            return EXIT_ERROR;
        }
    };
    let doc: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            stderr_line(
                "error",
                &format!(
                    "the agent's view is not JSON ({e}): is this redirect-cni-node's /debug/node?"
                ),
            );
            return EXIT_ERROR;
        }
    };
    if m.get_flag("json") {
        println!("{text}");
    } else {
        print!("{}", table(&doc));
    }
    if attention(&doc) > 0 {
        EXIT_DIFFERS
    } else {
        EXIT_OK
    }
}

/// `GET /debug/node` from `agent` (`http://HOST:PORT`).
fn fetch(agent: &str) -> Result<String, String> {
    let bad = |why: &str| {
        format!("--agent {agent:?}: {why}; expected http://HOST:PORT, e.g. {DEFAULT_AGENT}")
    };
    let rest = agent
        .strip_prefix("http://")
        .ok_or_else(|| bad("only plain http:// is served"))?;
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains('/') {
        return Err(bad("give the address alone, without a path"));
    }
    let addr = host
        .to_socket_addrs()
        .map_err(|e| bad(&e.to_string()))?
        .next()
        .ok_or_else(|| bad("no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| {
        format!("cannot reach the node agent at {agent}: {e} (is redirect-cni-node running, and its MONITORING_PORT this one?)")
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /debug/node HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{agent}: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("{agent}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{agent}: an answer that is not HTTP"))?;
    let status = head.get(9..12).unwrap_or("");
    if status != "200" {
        return Err(format!(
            "{agent}/debug/node answered {}: an agent older than /debug/node?",
            head.lines().next().unwrap_or("")
        ));
    }
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    Ok(if chunked {
        unchunk(body)
    } else {
        body.to_owned()
    })
}

/// A chunked body, joined.
fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// How many pods need attention.
fn attention(doc: &Value) -> usize {
    pods(doc)
        .iter()
        .filter(|p| !p["attention"].is_null())
        .count()
}

fn pods(doc: &Value) -> Vec<&Value> {
    doc["pods"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The view as text: ztunnel and the host table, then one row a pod (those that need
/// attention first, as the agent sorts them), then why each needs it.
fn table(doc: &Value) -> String {
    let mut out = format!("node {}, read at {}\n", s(&doc["node"]), s(&doc["at"]));
    if !doc["ambient"].is_null() {
        out.push_str(&ambient_lines(&doc["ambient"]));
    }
    out.push('\n');
    let rows: Vec<[String; 7]> = pods(doc).iter().map(|p| row(p)).collect();
    out.push_str(&columns(&rows));
    if rows.is_empty() {
        out.push_str("(no pod of the mesh on this node)\n");
    }
    let needing: Vec<String> = pods(doc)
        .iter()
        .filter(|p| !p["attention"].is_null())
        .map(|p| {
            format!(
                "! {}/{}: {}",
                s(&p["namespace"]),
                s(&p["name"]),
                s(&p["attention"])
            )
        })
        .collect();
    if !needing.is_empty() {
        out.push('\n');
        out.push_str(&needing.join("\n"));
        out.push('\n');
    }
    out
}

/// ztunnel's connection, the host's probe table and the passes, a line each.
fn ambient_lines(a: &Value) -> String {
    let z = &a["ztunnel"];
    let conn = if z["connected"].as_bool() == Some(true) {
        format!(
            "connected (connection {} since {})",
            s(&z["connection"]),
            s(&z["connected_since"])
        )
    } else {
        "NOT CONNECTED".into()
    };
    let h = &a["host_probe"];
    let members = match h["members"].as_array() {
        Some(m) => format!("{} address(es)", m.len()),
        None if h["configured"].as_bool() == Some(true) => "TABLE MISSING".into(),
        None => "not configured (kubelet not found)".into(),
    };
    let branch_eni = match h["branch_eni_rules"].as_array().map(Vec::len) {
        Some(n) if n > 0 => format!(", {n} branch-ENI probe rule(s)"),
        _ => String::new(),
    };
    let p = &a["pass"];
    let repairs = p["repairs"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "none".into());
    format!(
        "ztunnel: {conn}; {} connection(s) since the agent started, {} closed before their \
         hello\nhost probe table: {members}{branch_eni}, read at {}{}\npasses: {} (every {} s, the last at \
         {} took {:.1} ms); repairs: {repairs}\n",
        s(&z["connections"]),
        s(&z["closed_silent"]),
        s(&h["checked_at"]),
        repair_text(&h["repair"])
            .map(|r| format!("; last repair {r}"))
            .unwrap_or_default(),
        s(&p["passes"]),
        s(&p["interval_s"]),
        s(&p["last"]),
        p["took_ms"].as_f64().unwrap_or(0.0)
    )
}

/// One pod's row: attention mark, pod, capture, state, rules, ztunnel, last repair.
fn row(p: &Value) -> [String; 7] {
    let rules = match p["rules"]["differences"].as_array() {
        None => "-".to_string(),
        Some(d) if d.is_empty() => format!("equal at {}", short_time(&p["rules"]["at"])),
        Some(d) => format!("{} diff at {}", d.len(), short_time(&p["rules"]["at"])),
    };
    let ztunnel = match &p["ztunnel"] {
        Value::Null => "-".to_string(),
        z if z["acked"].as_bool() == Some(true) => format!("acked on {}", s(&z["connection"])),
        z if !z["refused"].is_null() => "refused".to_string(),
        z if z["connection"].is_null() => "no connection".to_string(),
        _ => "not acked".to_string(),
    };
    [
        if p["attention"].is_null() { " " } else { "!" }.to_string(),
        format!("{}/{}", s(&p["namespace"]), s(&p["name"])),
        s(&p["kind"]),
        s(&p["state"]),
        rules,
        ztunnel,
        repair_text(&p["last_repair"]).unwrap_or_else(|| "-".into()),
    ]
}

/// The rows under their header, each column as wide as its widest cell.
fn columns(rows: &[[String; 7]]) -> String {
    let header = [
        "",
        "POD",
        "CAPTURE",
        "STATE",
        "RULES (READ BACK)",
        "ZTUNNEL",
        "LAST REPAIR",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(rows) {
        let last = r.len() - 1;
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == last {
                    c.clone()
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `<time> <kind>: <why>`, or `None` when there was none.
fn repair_text(r: &Value) -> Option<String> {
    if r.is_null() {
        return None;
    }
    Some(format!(
        "{} {}: {}",
        short_time(&r["at"]),
        s(&r["kind"]),
        s(&r["why"])
    ))
}

/// An RFC 3339 time's clock part (`2026-11-27T22:06:49Z` → `22:06:49`).
fn short_time(t: &Value) -> String {
    let t = s(t);
    t.split_once('T')
        .map(|(_, clock)| clock.trim_end_matches('Z').to_string())
        .unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        serde_json::json!({
            "node": "worker-3", "at": "2026-11-27T22:00:00Z",
            "ambient": {
                "ztunnel": {"socket": "/var/run/ztunnel/ztunnel.sock", "connected": true,
                            "connection": 3, "connected_since": "2026-11-27T21:00:00Z",
                            "connections": 3, "closed_silent": 0},
                "host_probe": {"configured": true, "members": ["10.0.0.2"],
                               "checked_at": "2026-11-27T22:00:00Z",
                               "repair": {"at": "2026-11-27T21:59:00Z", "kind": "host_table",
                                          "why": "the host's probe table was gone"}},
                "pass": {"passes": 12, "last": "2026-11-27T22:00:00Z", "took_ms": 3.2,
                         "interval_s": 5.0, "repairs": {"host_table": 1}}
            },
            "pods": [
                {"namespace": "shop", "name": "api", "uid": "u2", "kind": "ambient",
                 "state": "pending", "attention": "ztunnel refused it: no",
                 "ips": [], "rules": {"at": "2026-11-27T22:00:00Z", "differences": []},
                 "last_repair": null,
                 "ztunnel": {"connection": 3, "acked": false, "refused": "no"}},
                {"namespace": "shop", "name": "web", "uid": "u1", "kind": "ambient",
                 "state": "enabled", "attention": null, "ips": ["10.0.0.2"],
                 "rules": {"at": "2026-11-27T22:00:00Z", "differences": []},
                 "last_repair": {"at": "2026-11-27T21:58:00Z", "kind": "pod_rules",
                                 "why": "our table is missing"},
                 "ztunnel": {"connection": 3, "acked": true, "refused": null}},
                {"namespace": "books", "name": "reviews", "uid": "u3", "kind": "sidecar",
                 "state": "ok", "attention": null, "ips": [], "rules": null,
                 "last_repair": null, "ztunnel": null}
            ]
        })
    }

    #[test]
    fn the_table_puts_what_needs_attention_first_and_says_why() {
        let t = table(&doc());
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].contains("connected (connection 3"), "{t}");
        assert!(
            lines[2].contains("1 address(es)") && lines[2].contains("host_table"),
            "{t}"
        );
        let api = lines.iter().position(|l| l.contains("shop/api")).unwrap();
        let web = lines.iter().position(|l| l.contains("shop/web")).unwrap();
        assert!(api < web, "{t}");
        assert!(
            lines[api].starts_with('!') && lines[api].contains("refused"),
            "{t}"
        );
        assert!(
            lines[web].contains("acked on 3") && lines[web].contains("pod_rules"),
            "{t}"
        );
        assert!(t.contains("! shop/api: ztunnel refused it: no"), "{t}");
        assert_eq!(attention(&doc()), 1);
    }

    #[test]
    fn a_missing_host_table_and_no_ztunnel_are_shouted() {
        let mut d = doc();
        d["ambient"]["ztunnel"]["connected"] = false.into();
        d["ambient"]["host_probe"]["members"] = Value::Null;
        let t = table(&d);
        assert!(t.contains("ztunnel: NOT CONNECTED"), "{t}");
        assert!(t.contains("host probe table: TABLE MISSING"), "{t}");
    }

    #[test]
    fn branch_eni_rules_are_counted_beside_the_host_table() {
        let mut d = doc();
        assert!(!table(&d).contains("branch-ENI"), "{}", table(&d));
        d["ambient"]["host_probe"]["branch_eni_rules"] = serde_json::json!([
            "to 10.0.0.2 lookup 101 pref 512",
            "iif vlanab lookup local pref 9 (IPv4)"
        ]);
        let t = table(&d);
        assert!(
            t.contains("host probe table: 1 address(es), 2 branch-ENI probe rule(s), read at"),
            "{t}"
        );
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(unchunk("4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n"), "wikipedia");
    }
}
