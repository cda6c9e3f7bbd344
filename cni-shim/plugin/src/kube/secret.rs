//! Keeping credentials out of messages: the secrets a kubeconfig holds, and a scrubber that
//! replaces them in any text before it reaches an error or a log.

use ::kube::config::Kubeconfig;
use secrecy::ExposeSecret;

/// What replaces a secret in a message.
const REDACTED: &str = "<redacted>";

/// Shorter strings are not scrubbed: they would mangle ordinary words, and no real token is
/// that short.
const MIN_SECRET_LEN: usize = 8;

/// The credentials one kubeconfig holds.
#[derive(Default)]
pub(crate) struct Secrets(Vec<String>);

impl Secrets {
    /// Secrets found in the kubeconfig's raw text, by line: the values of `token`,
    /// `password`, `client-key-data` and `id-token` / `refresh-token` keys. This works when
    /// the file does not parse, whose error message may quote any value.
    pub(crate) fn from_text(text: &str) -> Self {
        let mut secrets = Secrets::default();
        for line in text.lines() {
            let line = line.trim_start().trim_start_matches("- ");
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let key = key.trim().trim_matches(['"', '\'']);
            if matches!(
                key,
                "token" | "password" | "client-key-data" | "id-token" | "refresh-token"
            ) {
                let value = value.trim().trim_matches(['"', '\'']);
                secrets.add(value);
            }
        }
        secrets
    }

    /// Adds the secrets of a parsed kubeconfig: every user's token, token file contents and
    /// password.
    pub(crate) fn add_kubeconfig(&mut self, kubeconfig: &Kubeconfig) {
        for named in &kubeconfig.auth_infos {
            let Some(user) = &named.auth_info else {
                continue;
            };
            if let Some(token) = &user.token {
                self.add(token.expose_secret());
            }
            if let Some(password) = &user.password {
                self.add(password.expose_secret());
            }
            if let Some(file) = &user.token_file {
                if let Ok(contents) = std::fs::read_to_string(file) {
                    self.add(&contents);
                }
            }
        }
    }

    fn add(&mut self, secret: &str) {
        let secret = secret.trim();
        if secret.len() >= MIN_SECRET_LEN && !self.0.iter().any(|s| s == secret) {
            self.0.push(secret.to_owned());
            // Longest first, so a secret containing another is replaced whole.
            self.0.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// `text` with every secret replaced.
    pub(crate) fn scrub(&self, text: impl Into<String>) -> String {
        let mut text = text.into();
        for secret in &self.0 {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        text
    }
}
