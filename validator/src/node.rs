//! `node`: the node agent's view of every pod on its node (`GET /debug/node` on the agent's
//! socket, `<CNI_AGENT_RUN_DIR>/debug.sock`, the node's root's alone; or on a TCP address
//! forwarded to it; or a saved copy), as a table an operator reads at a glance: the pods that
//! need attention first, each with its capture (sidecar or ambient), its state, its rules as
//! last read back and when, its last repair and why, and what ztunnel acked on which
//! connection.
//!
//! The answer is read as `node_fetch` bounds it (16 MiB, 15 s for the whole fetch), and nothing
//! of it reaches the terminal raw: every string printed from it has its control characters
//! (and the bidirectional overrides) escaped, `\u{1b}` for an ESC.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::{Arg, ArgAction, Command};
use redirect_program::logging::{escape, needs_escape, stderr_line};
use serde_json::Value;

use crate::node_fetch::{self, Target, DEADLINE, MAX_ANSWER_TEXT};
use crate::{EXIT_DIFFERS, EXIT_ERROR, EXIT_OK};

const ABOUT: &str = "Shows the node agent's view of every pod on its node (GET /debug/node on the agent's socket, root's alone): the pods that need attention first; exit 2 when one does";
/// The agent's socket on the node: `debug.sock` in its run directory (CNI_AGENT_RUN_DIR, the
/// chart's and the agent's default).
pub const DEFAULT_SOCKET: &str = "/var/run/redirect-cni/debug.sock";

/// The command's flags.
fn command() -> Command {
    Command::new("redirect-validate node")
        .about(ABOUT)
        .after_help(format!(
            "The answer is refused past {MAX_ANSWER_TEXT}, and the whole fetch (connecting, \
             asking, reading) past {} s.",
            DEADLINE.as_secs()
        ))
        .arg(
            Arg::new("socket")
                .long("socket")
                .value_name("PATH")
                .help(format!(
                    "The agent's socket (root's alone) [default: {DEFAULT_SOCKET}]"
                )),
        )
        .arg(
            Arg::new("agent")
                .long("agent")
                .value_name("URL")
                .conflicts_with("socket")
                .help("The node view forwarded to a TCP address instead (http://HOST:PORT)"),
        )
        .arg(
            Arg::new("file")
                .long("file")
                .value_name("FILE")
                .conflicts_with_all(["agent", "socket"])
                .help("Read a saved copy of /debug/node instead (e.g. from kubectl exec ... redirect-validate node --json)"),
        )
        .arg(
            Arg::new("json")
                .long("json")
                .action(ArgAction::SetTrue)
                .help("Print the agent's JSON as it came (its control characters as \\u escapes)"),
        )
}

pub fn main(args: Vec<OsString>) -> i32 {
    let cmd = command();
    let m = match cmd.try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_ERROR } else { EXIT_OK };
        }
    };
    let text = match (m.get_one::<String>("file"), m.get_one::<String>("agent")) {
        (Some(f), _) => std::fs::read_to_string(f).map_err(|e| format!("--file {f}: {e}")),
        (None, Some(agent)) => tcp_target(agent).and_then(|t| node_fetch::get(&t, "/debug/node")),
        (None, None) => {
            let socket = m
                .get_one::<String>("socket")
                .map(String::as_str)
                .unwrap_or(DEFAULT_SOCKET);
            node_fetch::get(&Target::Socket(PathBuf::from(socket)), "/debug/node")
        }
    };
    let text = match text {
        Ok(t) => t,
        Err(msg) => {
            stderr_line("error", &msg);
            return EXIT_ERROR;
        }
    };
    if let Err(msg) = few_enough_values(&text) {
        stderr_line("error", &msg);
        return EXIT_ERROR;
    }
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
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let _ = json_for_terminal(&text, &mut out).and_then(|()| writeln!(out));
    } else {
        drop(text);
        print!("{}", table(&doc));
    }
    if attention(&doc) > 0 {
        EXIT_DIFFERS
    } else {
        EXIT_OK
    }
}

/// `--agent http://HOST:PORT` as a target.
fn tcp_target(agent: &str) -> Result<Target, String> {
    let bad = |why: &str| {
        format!("--agent {agent:?}: {why}; expected http://HOST:PORT, e.g. http://127.0.0.1:15014 (a port forwarded to the agent's socket)")
    };
    let rest = agent
        .strip_prefix("http://")
        .ok_or_else(|| bad("only plain http:// is served"))?;
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains('/') {
        return Err(bad("give the address alone, without a path"));
    }
    Ok(Target::Tcp {
        url: agent.trim_end_matches('/').to_string(),
        host: host.to_string(),
    })
}

/// The most JSON values (arrays, objects, their members) parsed: the view of a full node holds
/// a few thousand, and each costs a hundred bytes or so parsed, whatever its size in the text
/// (`[0,0,...]` of 16 MiB would take gigabytes).
pub const MAX_VALUES: usize = 100_000;

/// Refuses a document of more than [`MAX_VALUES`] values before it is parsed: its commas and
/// brackets outside strings, counted.
fn few_enough_values(text: &str) -> Result<(), String> {
    let (mut n, mut in_string, mut escaped) = (1usize, false, false);
    for &b in text.as_bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b'[' | b'{' => n += 1,
            _ => {}
        }
        if n > MAX_VALUES {
            return Err(format!(
                "the agent's view holds more than {MAX_VALUES} JSON values: no node's view is \
                 that large (a full node's holds a few thousand); is this redirect-cni-node's \
                 /debug/node?"
            ));
        }
    }
    Ok(())
}

/// The agent's JSON text, written to `out` with every character a terminal could act on as a
/// JSON escape: the same document. A valid document holds control characters raw only as
/// whitespace between tokens (tab, CR: written as spaces) or inside strings (DEL, C1, the
/// bidirectional overrides: `\uXXXX`, all of them in the BMP).
fn json_for_terminal(text: &str, out: &mut impl Write) -> std::io::Result<()> {
    let mut plain = 0;
    for (i, c) in text.char_indices() {
        let swap = match c {
            '\n' => continue,
            '\t' | '\r' => " ".to_string(),
            c if needs_escape(c) => format!("\\u{:04x}", c as u32),
            _ => continue,
        };
        out.write_all(&text.as_bytes()[plain..i])?;
        out.write_all(swap.as_bytes())?;
        plain = i + c.len_utf8();
    }
    out.write_all(&text.as_bytes()[plain..])
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

/// The most characters of one value printed in the table.
const MAX_CELL: usize = 1024;

/// A value of the document as printed: its control characters escaped, at most [`MAX_CELL`]
/// characters of it.
fn s(v: &Value) -> String {
    let shown = |t: &str| match t.char_indices().nth(MAX_CELL) {
        None => escape(t),
        Some((cut, _)) => format!("{}... ({} more bytes)", escape(&t[..cut]), t.len() - cut),
    };
    match v {
        Value::Null => "-".into(),
        Value::String(t) => shown(t),
        other => shown(&other.to_string()),
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
    let rows: Vec<[String; 8]> = pods(doc).iter().map(|p| row(p)).collect();
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
    out.push_str(&synthetic_lines(doc));
    out
}

/// The ambient pods' last synthetic checks (`AMBIENT_SYNTHETIC_CHECK`), a line each under
/// the table: observational, a failed one changes no pod's state.
fn synthetic_lines(doc: &Value) -> String {
    let lines: Vec<String> = pods(doc)
        .iter()
        .map(|p| (p, &p["synthetic_check"]))
        .filter(|(_, c)| !c.is_null())
        .map(|(p, c)| {
            let ok = if c["ok"].as_bool() == Some(true) {
                "ok"
            } else {
                "FAILED"
            };
            format!(
                "synthetic check {}/{} at {}: {ok}: {}",
                s(&p["namespace"]),
                s(&p["name"]),
                short_time(&c["at"]),
                s(&c["detail"])
            )
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    format!("\n{}\n", lines.join("\n"))
}

/// ztunnel's connection, the host's probe table and the passes, a line each.
fn ambient_lines(a: &Value) -> String {
    let z = &a["ztunnel"];
    let conn = if z["connected"].as_bool() == Some(true) {
        // During a ztunnel rollout the old connection stays open for deletes.
        let open = match z["connections_open"].as_u64() {
            Some(n) if n > 1 => format!(", {n} open: the newest serves adds"),
            _ => String::new(),
        };
        format!(
            "connected (connection {} since {}{open})",
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
                .map(|(k, v)| format!("{} {}", s(&Value::String(k.clone())), s(v)))
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

/// One pod's row: attention mark, pod, capture, state, rules, ztunnel, its listeners in the
/// pod, last repair.
fn row(p: &Value) -> [String; 8] {
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
        listeners(&p["ztunnel"]["listeners"]),
        repair_text(&p["last_repair"]).unwrap_or_else(|| "-".into()),
    ]
}

/// ztunnel's listeners in an ambient pod as the agent last read them: `seen since <time>`,
/// `MISSING <ports> since <time>`, or `-` when not read (not acked, or the agent's
/// `AMBIENT_CHECK_LISTENERS=false`).
fn listeners(l: &Value) -> String {
    if l.is_null() {
        return "-".into();
    }
    if !l["error"].is_null() {
        return "UNREADABLE".into();
    }
    let since = short_time(&l["since"]);
    if l["seen"].as_bool() == Some(true) {
        return format!("seen since {since}");
    }
    let missing: Vec<String> = l["missing"]
        .as_array()
        .map(|m| m.iter().map(s).collect())
        .unwrap_or_default();
    format!("MISSING {} since {since}", missing.join(","))
}

/// The rows under their header, each column as wide as its widest cell.
fn columns(rows: &[[String; 8]]) -> String {
    let header = [
        "",
        "POD",
        "CAPTURE",
        "STATE",
        "RULES (READ BACK)",
        "ZTUNNEL",
        "LISTENERS",
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
    fn ztunnels_listeners_show_seen_or_missing_with_since_when() {
        let mut d = doc();
        d["pods"][1]["ztunnel"]["listeners"] = serde_json::json!({
            "checked_at": "2026-11-27T22:00:00Z", "seen": true, "missing": [],
            "since": "2026-11-27T21:40:00Z", "error": null});
        d["pods"][0]["ztunnel"]["acked"] = true.into();
        d["pods"][0]["ztunnel"]["listeners"] = serde_json::json!({
            "checked_at": "2026-11-27T22:00:00Z", "seen": false,
            "missing": ["15001/tcp", "15053/udp"], "since": "2026-11-27T21:59:55Z",
            "error": null});
        let t = table(&d);
        let line = |pod: &str| t.lines().find(|l| l.contains(pod)).unwrap().to_string();
        assert!(line("shop/web").contains("seen since 21:40:00"), "{t}");
        assert!(
            line("shop/api").contains("MISSING 15001/tcp,15053/udp since 21:59:55"),
            "{t}"
        );
        assert!(line("books/reviews").contains("  -  "), "{t}");
        assert!(
            t.lines().next_back().is_some() && t.contains("LISTENERS"),
            "{t}"
        );
    }

    #[test]
    fn the_last_synthetic_check_is_said_under_the_table() {
        let mut d = doc();
        assert!(!table(&d).contains("synthetic check"), "none ran");
        d["pods"][1]["synthetic_check"] = serde_json::json!({
            "at": "2026-11-27T22:00:01Z", "ok": false, "result": "refused",
            "detail": "refused: a connection to 192.0.2.1:9 was reset", "took_ms": 0.4});
        let t = table(&d);
        assert!(
            t.contains("synthetic check shop/web at 22:00:01: FAILED: refused: a connection"),
            "{t}"
        );
    }

    #[test]
    fn two_open_connections_during_a_rollout_are_said() {
        let mut d = doc();
        let first = table(&d);
        assert!(!first.contains(" open:"), "{first}");
        d["ambient"]["ztunnel"]["connections_open"] = 2.into();
        let t = table(&d);
        assert!(
            t.lines().nth(1).is_some_and(|l| l.contains(
                "(connection 3 since 2026-11-27T21:00:00Z, 2 open: the newest serves adds)"
            )),
            "{t}"
        );
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
    fn what_the_document_holds_is_printed_escaped() {
        let mut d = doc();
        d["pods"][0]["name"] = "api\u{1b}[2J".into();
        d["ambient"]["pass"]["repairs"] = serde_json::json!({"x\u{9b}1m": 1});
        let t = table(&d);
        assert!(!t.contains('\u{1b}') && !t.contains('\u{9b}'), "{t:?}");
        assert!(t.contains("shop/api\\u{1b}[2J"), "{t}");
        assert!(t.contains("x\\u{9b}1m 1"), "{t}");
    }

    #[test]
    fn the_json_printed_is_the_same_document_without_raw_controls() {
        let text = "{\"a\":\t\"b\u{7f}\u{9b}\u{202e}c\",\r\n\"d\": [1], \"é\": 1}";
        let mut out = Vec::new();
        json_for_terminal(text, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.chars().all(|c| c == '\n' || !c.is_control()), "{out:?}");
        assert!(!out.contains('\u{202e}'), "{out:?}");
        let (a, b): (Value, Value) = (
            serde_json::from_str(text).unwrap(),
            serde_json::from_str(&out).unwrap(),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn a_document_of_too_many_values_is_refused_before_parsing() {
        let many = format!("[{}0]", "0,".repeat(MAX_VALUES));
        let e = few_enough_values(&many).unwrap_err();
        assert!(e.contains("more than 100000 JSON values"), "{e}");
        // Commas and brackets inside strings are text.
        let text = format!(
            "{{\"a\": \"{}\\\"\", \"b\": [1, 2]}}",
            ",[{".repeat(MAX_VALUES)
        );
        serde_json::from_str::<Value>(&text).unwrap();
        few_enough_values(&text).unwrap();
        few_enough_values(&serde_json::to_string(&doc()).unwrap()).unwrap();
    }

    #[test]
    fn a_long_value_is_cut_in_the_table() {
        let mut d = doc();
        d["pods"][0]["name"] = "x".repeat(5000).into();
        let t = table(&d);
        assert!(
            t.contains(&format!("shop/{}... (3976 more bytes)", "x".repeat(1024))),
            "{t}"
        );
    }
}
