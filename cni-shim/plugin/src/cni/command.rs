//! `CNI_COMMAND`: what the runtime asks of the plugin.

/// A command of the CNI spec (1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
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

    /// Whether it is one of a pod's calls (ADD, DEL, CHECK): those log their start and end
    /// and are told to the node agent. STATUS and GC, called every few seconds, are not.
    pub fn is_pods(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
