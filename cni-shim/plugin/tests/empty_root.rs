//! The shipped binaries need nothing from the host but the kernel. Each static release binary
//! (`scripts/build-static.sh` puts them in `target/static/<arch>/`) runs from an empty root: a
//! directory holding only the binary, `/proc`, and the network namespace file it works on. From
//! there:
//!
//! - `redirect-cni`: VERSION, then ADD, CHECK and DEL on a real pod namespace, with the same
//!   rules in the kernel as the workspace's plugin writes for the same input;
//! - `redirect-init`: Istio's default flags, read back equal to the plan of Istio's defaults;
//! - `redirect-validate`: Istio's validation probe, as UID 1337 with no capability, passes.
//!
//! A control runs the workspace's own (dynamically linked) plugin in the same kind of root: it
//! must fail to start there, or the root would not be empty enough to prove anything.
//!
//! Each run is `unshare --mount` (so the bind mounts vanish with the process), `mount --bind`
//! of /proc and the namespace file, then `chroot ROOT /binary`: the binary itself sees nothing
//! of the host's files.

use cni_testkit as common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{cni_env, mesh_conf, plugin_bin, pod_ns, static_bin, ARGS};
use redirect_core::CaptureConfig;
use redirect_testkit::istio::SIDECAR_ARGS;
use redirect_testkit::plan;
use redirect_testkit::{kernel_test, TestNetns};

/// A root holding only `bin` (as `/<name>`), an empty `/proc` and an empty `/netns` to bind
/// mounts on.
struct EmptyRoot {
    dir: PathBuf,
    exe: String,
}

impl EmptyRoot {
    fn new(bin: &Path) -> EmptyRoot {
        let name = bin.file_name().unwrap().to_str().unwrap().to_string();
        let dir = std::env::temp_dir().join(format!(
            "rdroot-{}-{}-{name}",
            std::process::id(),
            std::thread::current()
                .name()
                .unwrap_or("t")
                .replace("::", "-")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc")).unwrap();
        std::fs::write(dir.join("netns"), b"").unwrap();
        std::fs::copy(bin, dir.join(&name)).unwrap();
        let listing: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(listing.len(), 3, "the root holds more: {listing:?}");
        EmptyRoot {
            dir,
            exe: format!("/{name}"),
        }
    }

    /// Run the binary in the root with `args`, only the variables `env`, and `stdin`;
    /// `netns` is bind-mounted at `/netns`; `enter` also makes it the process's network
    /// namespace; `user` runs it as that uid:gid (no capability left).
    fn run(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        stdin: &str,
        netns: &Path,
        enter: bool,
        user: Option<(u32, u32)>,
    ) -> common::Out {
        let dir = self.dir.to_str().unwrap();
        let mut script = format!(
            "mount --bind /proc {dir}/proc && mount --bind {} {dir}/netns && exec ",
            netns.display()
        );
        if enter {
            script += &format!("nsenter --net={} ", netns.display());
        }
        script += "chroot ";
        if let Some((u, g)) = user {
            script += &format!("--userspec={u}:{g} --groups={g} ");
        }
        script += &format!("{dir} {} \"$@\"", self.exe);
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn unshare");
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        let out = child.wait_with_output().unwrap();
        common::Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Drop for EmptyRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[kernel_test]
fn the_plugin_runs_add_check_del_from_an_empty_root() {
    let root = EmptyRoot::new(&static_bin("redirect-cni"));
    let pod = pod_ns();
    let conf = mesh_conf();
    let env = |cmd| cni_env(cmd, "/netns", ARGS);

    let out = root.run(&[], &env("VERSION"), "", pod.path(), false, None);
    assert_eq!(out.code, 0, "VERSION: {out:?}");
    assert!(
        out.json()["supportedVersions"].as_array().is_some(),
        "{out:?}"
    );

    let out = root.run(&[], &env("ADD"), &conf, pod.path(), false, None);
    assert_eq!(out.code, 0, "ADD: {out:?}");
    let written = redirect_kernel::testing::nft_in(pod.path())
        .read()
        .unwrap()
        .expect("ADD wrote our table");
    // The workspace's plugin, for the same input, writes the same table.
    let twin = pod_ns();
    let twin_path = twin.path().to_str().unwrap();
    let out = common::plugin(&cni_env("ADD", twin_path, ARGS), &conf);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        Some(written),
        redirect_kernel::testing::nft_in(twin.path())
            .read()
            .unwrap()
    );

    let out = root.run(&[], &env("CHECK"), &conf, pod.path(), false, None);
    assert_eq!(out.code, 0, "CHECK: {out:?}");
    let out = root.run(&[], &env("DEL"), &conf, pod.path(), false, None);
    assert_eq!(out.code, 0, "DEL: {out:?}");
    assert_eq!(
        redirect_kernel::testing::nft_in(pod.path()).read().unwrap(),
        None,
        "DEL left the table"
    );
}

#[kernel_test]
fn the_init_container_and_the_probe_run_from_empty_roots() {
    let init = EmptyRoot::new(&static_bin("redirect-init"));
    let pod = pod_ns();
    let out = init.run(SIDECAR_ARGS, &[], "", pod.path(), true, None);
    assert_eq!(out.code, 0, "redirect-init: {out:?}");
    let rs = plan(&CaptureConfig::istio_sidecar_default()).unwrap();
    let diff = redirect_kernel::testing::nft_in(pod.path())
        .diff(&rs)
        .unwrap();
    assert!(diff.is_empty(), "{diff:#?}");

    // Istio's validation init container: as the proxy's UID, no capability.
    let validate = EmptyRoot::new(&static_bin("redirect-validate"));
    let out = validate.run(&[], &[], "", pod.path(), true, Some((1337, 1337)));
    assert_eq!(out.code, 0, "redirect-validate: {out:?}");
    // And it can fail there: in a namespace without the rules it exits 126.
    let bare = TestNetns::new();
    bare.sh("ip link add eth0 type veth peer name peer0 && ip addr add 10.33.0.5/24 dev eth0 && ip link set eth0 up");
    let out = validate.run(&[], &[], "", bare.path(), true, Some((1337, 1337)));
    assert_eq!(out.code, 126, "redirect-validate without rules: {out:?}");
}

/// The control: a dynamically linked build cannot even start in such a root.
#[kernel_test]
fn a_dynamic_build_does_not_start_from_an_empty_root() {
    let elf = std::fs::read(plugin_bin()).unwrap();
    assert!(
        elf.windows(b"ld-linux".len()).any(|w| w == b"ld-linux"),
        "the workspace's plugin ({}) is expected to be a dynamic build, for this control",
        plugin_bin()
    );
    let root = EmptyRoot::new(Path::new(plugin_bin()));
    let pod = pod_ns();
    let out = root.run(
        &[],
        &cni_env("VERSION", "/netns", ARGS),
        "",
        pod.path(),
        false,
        None,
    );
    assert_ne!(
        out.code, 0,
        "a dynamic build started in the empty root: {out:?}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
}
