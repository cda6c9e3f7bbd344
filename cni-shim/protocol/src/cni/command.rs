//! `CNI_COMMAND`: what the runtime asks of the plugin.

/// A command of the CNI spec (1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Set up a container's network: the plugin programs the pod's capture.
    Add,
    /// Tear a container's network down: the plugin removes its capture.
    Del,
    /// Check that a container's network is as ADD left it.
    Check,
    /// Whether the plugin is ready to serve ADD (1.1.0).
    Status,
    /// Clean up what belongs to containers that no longer exist (1.1.0).
    Gc,
    /// Which spec versions the plugin speaks.
    Version,
}

impl Command {
    /// Every command, in the spec's order.
    pub const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Status,
        Command::Gc,
        Command::Version,
    ];

    /// The name the runtime sends (`ADD`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// The command named `name`, exactly as the spec spells it.
    pub fn from_name(name: &str) -> Option<Command> {
        Command::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The first spec version that has the command (CHECK came in 0.4.0, STATUS and GC in
    /// 1.1.0), as libcni's skel and so Istio's plugin hold the config's `cniVersion` to it.
    pub fn since(self) -> &'static str {
        match self {
            Command::Check => "0.4.0",
            Command::Status | Command::Gc => "1.1.0",
            Command::Add | Command::Del | Command::Version => "0.1.0",
        }
    }

    /// Whether a config of `version` may ask for the command.
    pub fn allowed_in(self, version: &str) -> bool {
        version_key(version) >= version_key(self.since())
    }

    /// Whether it is one of a pod's calls (ADD, DEL, CHECK): those log their start and end
    /// and are told to the node agent. STATUS and GC, called every few seconds, are not.
    pub fn is_pods(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// A version's numbers, for comparing (a part that is not a number counts as 0).
fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_from_its_version() {
        assert!(Command::Add.allowed_in("0.3.0"));
        assert!(!Command::Check.allowed_in("0.3.1"));
        assert!(Command::Check.allowed_in("0.4.0"));
        assert!(Command::Check.allowed_in("1.0.0"));
        for c in [Command::Status, Command::Gc] {
            assert!(!c.allowed_in("1.0.0"), "{c}");
            assert!(c.allowed_in("1.1.0"), "{c}");
            assert!(c.allowed_in("1.10.0"), "{c}");
        }
    }
}
