//! Plugin logs: stderr and, when the config names one, a file. Never stdout (the protocol).

use std::io::Write;
use std::path::PathBuf;

use crate::cni::conf::NetConf;

pub struct Log {
    level: u8,
    file: Option<PathBuf>,
}

fn rank(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        "error" => 3,
        _ => 4,
    }
}

impl Log {
    pub fn new(conf: &NetConf) -> Log {
        Log {
            level: rank(&conf.log_level),
            file: conf.log_file.clone(),
        }
    }

    /// Before the config is read (so before its level and file are known): stderr, every level
    /// from info up.
    pub fn stderr_only() -> Log {
        Log {
            level: rank("info"),
            file: None,
        }
    }

    fn write(&self, level: &str, msg: &str) {
        if rank(level) < self.level {
            return;
        }
        let line = format!("{level}\tredirect-cni\t{msg}\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
        if let Some(path) = &self.file {
            // The file gathers every pod's lines on the node: each needs its time. (The
            // runtime stamps stderr itself.)
            let line = format!(
                "{}\t{line}",
                humantime::format_rfc3339_millis(std::time::SystemTime::now())
            );
            // A log file we cannot write must not fail the pod.
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = f.write_all(line.as_bytes());
            }
        }
    }

    pub fn info(&self, msg: &str) {
        self.write("info", msg);
    }

    pub fn warn(&self, msg: &str) {
        self.write("warn", msg);
    }

    pub fn error(&self, msg: &str) {
        self.write("error", msg);
    }
}
