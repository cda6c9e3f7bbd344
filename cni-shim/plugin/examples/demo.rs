//! The demo (`bash scripts/demo.sh`): a pod's network set up by the CNI reference client
//! (`cnitool`), with Debian's `bridge` + `host-local` and `redirect-cni` chained after them, for
//! a pod carrying Istio's default sidecar annotations. Then: the table the plugin wrote
//! (`redirect-validate inspect`), Istio's validation probe as the proxy's UID, real connections
//! whose landing place (the kernel's answer) is printed next to `redirect-validate explain`'s,
//! CNI CHECK and DEL. Everything lives in throwaway network namespaces and a temp dir, removed at
//! the end. Exits 1 when anything does not work as Istio's defaults say.
//!
//! Environment: `REDIRECT_BIN_DIR` (redirect-cni and redirect-validate; default
//! `target/debug`), `CNITOOL` (default `.tools/cnitool`). Needs root.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;

use redirect_testkit::istio::SIDECAR_ARGS;
use redirect_testkit::{Landing, Landings, TestNetns};
use serde_json::{json, Value};

/// What Istio's injector leaves on a pod for the CNI plugin, with Istio's default settings.
const STATUS: &str = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":["istio-envoy"],"imagePullSecrets":null}"#;
const NETWORK: &str = "podnet";
const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 22, 0, 1);

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "demo: run it as root: it creates network namespaces and programs nftables in them"
        );
        std::process::exit(1);
    }
    let root = redirect_testkit::docs::workspace();
    let bins = std::env::var_os("REDIRECT_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/debug"));
    let cnitool = std::env::var_os("CNITOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".tools/cnitool"));
    for needed in [
        bins.join("redirect-cni"),
        bins.join("redirect-validate"),
        cnitool.clone(),
    ] {
        if !needed.exists() {
            eprintln!(
                "demo: {} is missing: run `bash scripts/demo.sh`, which builds it",
                needed.display()
            );
            std::process::exit(1);
        }
    }
    let demo = Demo::new(bins, cnitool);
    let failures = demo.run();
    drop(demo);
    if failures.is_empty() {
        println!("\ndemo: capture works as Istio's defaults say; namespaces and files removed.");
    } else {
        println!("\ndemo: FAILED:");
        for f in &failures {
            println!("  - {f}");
        }
        std::process::exit(1);
    }
}

struct Demo {
    bins: PathBuf,
    cnitool: PathBuf,
    dir: PathBuf,
    node: TestNetns,
    pod: TestNetns,
}

/// Where a connection landed, as the kernel decided, or why it did not.
type Landed = Result<Landing, String>;

impl Demo {
    fn new(bins: PathBuf, cnitool: PathBuf) -> Demo {
        let dir = std::env::temp_dir().join(format!("redirect-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("net.d")).expect("create the demo's temp dir");
        Demo {
            bins,
            cnitool,
            dir,
            node: TestNetns::with_prefix("demo-node"),
            pod: TestNetns::with_prefix("demo-pod"),
        }
    }

    fn bin(&self, name: &str) -> String {
        self.bins.join(name).display().to_string()
    }

    fn run(&self) -> Vec<String> {
        let mut failures = Vec::new();
        println!("redirect demo: Istio's default sidecar capture, set up by redirect-cni");
        println!(
            "throwaway network namespaces: node {}, pod {}; files in {}",
            self.node.name(),
            self.pod.name(),
            self.dir.display()
        );

        // 1. The network config: bridge + host-local, then our plugin, chained.
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {"type": "bridge", "bridge": "demobr0", "isGateway": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/24"}]],
                          "dataDir": self.dir.join("ipam")}},
                {"type": "redirect-cni", "proxy_uid": 1337,
                 "exclude_namespaces": ["kube-system"], "log_file": self.dir.join("redirect-cni.log"),
                 "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
            ]
        });
        let conf_path = self.dir.join("net.d/10-podnet.conflist");
        std::fs::write(&conf_path, serde_json::to_string_pretty(&conflist).unwrap()).unwrap();
        let annotations = json!({
            "sidecar.istio.io/status": STATUS,
            "sidecar.istio.io/interceptionMode": "REDIRECT",
            "traffic.sidecar.istio.io/includeInboundPorts": "*",
            "traffic.sidecar.istio.io/excludeInboundPorts": "15020",
            "traffic.sidecar.istio.io/includeOutboundIPRanges": "*",
        });
        let pod_file = self.dir.join("pod-annotations.json");
        std::fs::write(
            &pod_file,
            serde_json::to_string_pretty(&annotations).unwrap(),
        )
        .unwrap();
        section("1. ADD through the CNI reference client, as a runtime would (containerd, CRI-O)");
        println!(
            "network {NETWORK}: bridge + host-local, then redirect-cni chained ({})",
            conf_path.display()
        );
        println!("pod default/web-0, annotations (the runtime passes them as a capability):");
        for (k, v) in annotations.as_object().unwrap() {
            println!("    {k}: {}", v.as_str().unwrap());
        }
        let add = self.cnitool("add", &annotations);
        let pod_ip = match add.code {
            0 => serde_json::from_str::<Value>(&add.stdout)
                .ok()
                .and_then(|v| v["ips"][0]["address"].as_str().map(str::to_string))
                .and_then(|a| a.split('/').next()?.parse::<IpAddr>().ok()),
            _ => None,
        };
        let Some(pod_ip) = pod_ip else {
            failures.push(format!(
                "cnitool add failed (exit {}): {}{}",
                add.code, add.stdout, add.stderr
            ));
            return failures;
        };
        println!("exit 0; the pod's address: {pod_ip} (bridge's result, passed on unchanged by redirect-cni)");
        let log = std::fs::read_to_string(self.dir.join("redirect-cni.log")).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains("captur")) {
            println!("redirect-cni log: {line}");
        }

        // 2. The table, read back over netlink, against what the annotations ask for.
        section(
            "2. The table redirect-cni wrote, read back and compared with the pod's annotations",
        );
        let inspect = self.show(
            Command::new(self.bin("redirect-validate")).args([
                "inspect",
                "--netns",
                &self.pod.path().display().to_string(),
                "--annotations",
                &pod_file.display().to_string(),
            ]),
            &format!(
                "redirect-validate inspect --netns {} --annotations {}",
                self.pod.path().display(),
                pod_file.display()
            ),
        );
        print_indented(&inspect.stdout);
        if inspect.code != 0 {
            failures.push(format!(
                "inspect: exit {}: {}",
                inspect.code, inspect.stderr
            ));
        }

        // 3. istio-validation's job: the probe, unprivileged, as the proxy's UID.
        section("3. The validation probe (istio-validation's job), as UID 1337 with no capability");
        let mut args = vec!["--run-validation", "--skip-rule-apply"];
        args.extend(SIDECAR_ARGS);
        let probe = self.show(
            Command::new("ip")
                .args(["netns", "exec", self.pod.name()])
                .args(["setpriv", "--reuid=1337", "--regid=1337", "--clear-groups"])
                .arg(self.bin("redirect-validate"))
                .args(&args),
            &format!(
                "ip netns exec {} setpriv --reuid=1337 --regid=1337 --clear-groups redirect-validate {}",
                self.pod.name(),
                shell_words(&args)
            ),
        );
        for line in probe
            .stderr
            .lines()
            .filter(|l| l.contains("Validation") || l.contains("error"))
        {
            println!("    {line}");
        }
        if probe.code != 0 {
            failures.push(format!(
                "validation probe: exit {}: {}",
                probe.code, probe.stderr
            ));
        }

        // 4. Real connections, next to explain's prediction.
        section(
            "4. Real connections: where the kernel sent them, next to `redirect-validate explain`",
        );
        println!("listeners: in the pod on 15001 (outbound capture), 15006 (inbound capture), 15021 (health);");
        println!("           on the node at {GATEWAY}:80 (a service outside the pod)");
        let landings = Landings::new();
        landings.listen(&self.pod, "pod", &[15001, 15006, 15021]);
        landings.listen(&self.node, "node", &[80]);
        let to_pod = |port| SocketAddr::new(pod_ip, port);
        let to_gw = SocketAddr::new(IpAddr::V4(GATEWAY), 80);
        let case = |flow: String, from, uid, dst, istio| Case {
            flow,
            from,
            uid,
            dst,
            istio,
        };
        let cases = [
            case(
                format!("in tcp {}", to_pod(8080)),
                &self.node,
                None,
                to_pod(8080),
                Some(15006),
            ),
            case(
                format!("in tcp {}", to_pod(15021)),
                &self.node,
                None,
                to_pod(15021),
                None,
            ),
            case(
                format!("out tcp uid=1000 {to_gw}"),
                &self.pod,
                Some(1000),
                to_gw,
                Some(15001),
            ),
            case(
                format!("out tcp uid=1337 {to_gw}"),
                &self.pod,
                Some(1337),
                to_gw,
                None,
            ),
        ];
        let mut explain_args = vec![
            "explain".to_string(),
            "--annotations".into(),
            pod_file.display().to_string(),
            "--pod-ip".into(),
            pod_ip.to_string(),
            "--json".into(),
        ];
        for c in &cases {
            explain_args.extend(["--flow".to_string(), c.flow.clone()]);
        }
        let explain = self.show(
            Command::new(self.bin("redirect-validate")).args(&explain_args),
            &format!("redirect-validate {}", shell_words(&explain_args)),
        );
        let predictions: Vec<Value> = match serde_json::from_str::<Value>(&explain.stdout) {
            Ok(Value::Array(a)) if explain.code == 0 && a.len() == cases.len() => a,
            _ => {
                failures.push(format!(
                    "explain: exit {}: {}",
                    explain.code, explain.stderr
                ));
                return failures;
            }
        };
        for (
            Case {
                flow,
                from,
                uid,
                dst,
                istio,
            },
            predicted,
        ) in cases.iter().zip(&predictions)
        {
            let landed = landings.connect(from, *uid, *dst);
            let verdict = &predicted["verdict"];
            let expected = match verdict["kind"].as_str() {
                Some("redirect") => Ok(Landing {
                    at: "pod",
                    port: verdict["port"].as_u64().unwrap_or(0) as u16,
                    orig: *dst,
                }),
                Some("pass") => Ok(Landing {
                    at: if *dst == to_gw { "node" } else { "pod" },
                    port: dst.port(),
                    orig: *dst,
                }),
                _ => Err(verdict.to_string()),
            };
            let agree = if landed == expected {
                "agree"
            } else {
                "DIFFER"
            };
            println!("    {flow}");
            println!("      kernel:  {}", describe(&landed));
            println!(
                "      explain: {} ({agree})",
                predicted["meaning"].as_str().unwrap_or("?")
            );
            if landed != expected {
                failures.push(format!(
                    "{flow}: the kernel says {landed:?}, explain says {verdict}"
                ));
            }
            let istio = match istio {
                Some(port) => Ok(Landing {
                    at: "pod",
                    port: *port,
                    orig: *dst,
                }),
                None => Ok(Landing {
                    at: if *dst == to_gw { "node" } else { "pod" },
                    port: dst.port(),
                    orig: *dst,
                }),
            };
            if landed != istio {
                failures.push(format!(
                    "{flow}: landed {landed:?}; Istio's defaults send it to {istio:?}"
                ));
            }
        }
        // 5. CHECK and DEL, as the runtime calls them.
        section("5. CNI CHECK and DEL");
        let check = self.cnitool("check", &annotations);
        println!("exit {}: the rules match the pod's annotations", check.code);
        if check.code != 0 {
            failures.push(format!("CHECK: exit {}: {}", check.code, check.stdout));
        }
        let del = self.cnitool("del", &annotations);
        let tables = self.pod.try_sh("nft list tables").unwrap_or_default();
        let gone = !tables.contains("redirect_capture");
        println!(
            "exit {}; the pod's nftables tables now: {}",
            del.code,
            if tables.trim().is_empty() {
                "none"
            } else {
                tables.trim()
            }
        );
        if del.code != 0 || !gone {
            failures.push(format!(
                "DEL: exit {}, table still there: {}",
                del.code, !gone
            ));
        }
        failures
    }

    /// `cnitool CMD podnet <pod>` from the node namespace, the annotations as CAP_ARGS.
    fn cnitool(&self, cmd: &str, annotations: &Value) -> Out {
        let cap_args = json!({ "io.kubernetes.cri.pod-annotations": annotations }).to_string();
        let cni_path = format!("/usr/lib/cni:{}", self.bins.display());
        let cni_args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";
        self.show(
            Command::new("ip")
                .args(["netns", "exec", self.node.name()])
                .arg(&self.cnitool)
                .args([cmd, NETWORK])
                .arg(self.pod.path())
                .env("CNI_PATH", &cni_path)
                .env("NETCONFPATH", self.dir.join("net.d"))
                .env("CNI_IFNAME", "eth0")
                .env("CNI_ARGS", cni_args)
                .env("CAP_ARGS", &cap_args),
            &format!(
                "{}ip netns exec {} cnitool {cmd} {NETWORK} {}",
                if cmd == "add" {
                    format!(
                        "CNI_PATH={cni_path} NETCONFPATH={} \\\n  CNI_ARGS='{cni_args}' \\\n  CAP_ARGS='{{\"io.kubernetes.cri.pod-annotations\": <the annotations>}}' \\\n  ",
                        self.dir.join("net.d").display()
                    )
                } else {
                    String::new()
                },
                self.node.name(),
                self.pod.path().display()
            ),
        )
    }

    /// Print `shown` as the command line, run `cmd`.
    fn show(&self, cmd: &mut Command, shown: &str) -> Out {
        println!("$ {shown}");
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // The namespaces go with their TestNetns; the bridge and veth die with them.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One connection of step 4.
struct Case<'a> {
    flow: String,
    from: &'a TestNetns,
    /// The client's UID (root when `None`).
    uid: Option<u32>,
    dst: SocketAddr,
    /// The capture port Istio's defaults send it to (`None`: not captured).
    istio: Option<u16>,
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn section(title: &str) {
    println!("\n== {title}");
}

fn print_indented(text: &str) {
    for line in text.lines() {
        println!("    {line}");
    }
}

/// Arguments as a shell would need them quoted.
fn shell_words<S: AsRef<str>>(args: &[S]) -> String {
    args.iter()
        .map(|a| {
            let a = a.as_ref();
            if a.is_empty() || a.contains(|c: char| " *'\"$".contains(c)) {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn describe(l: &Landed) -> String {
    match l {
        Ok(Landing { at, port, orig }) if orig.port() == *port => {
            format!("{at} port {port}, directly (not captured)")
        }
        Ok(Landing { at, port, orig }) => {
            format!("{at} port {port}, original destination {orig}")
        }
        Err(why) => why.clone(),
    }
}
