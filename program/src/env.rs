//! Reading the process environment the way the programs need: a variable they read whose
//! value is not UTF-8 is an error naming it. `std::env::var(..).ok()` would read it as unset and
//! silently drop the setting (a mesh pod passed through, a default capture applied).

use std::collections::HashMap;
use std::ffi::OsString;

/// The process environment, read once. A program looks up each of its settings' variables
/// (sixty for redirect-init); each `getenv` scans the whole environment, which made those
/// lookups an eighth of a default redirect-init run's instructions.
pub struct Env {
    vars: HashMap<OsString, OsString>,
}

impl Env {
    /// The environment as it is now.
    pub fn capture() -> Env {
        Env {
            vars: std::env::vars_os().collect(),
        }
    }

    /// A variable's value; `None` when it is unset or not UTF-8 ([`Env::check_utf8`] says
    /// which).
    pub fn get(&self, name: &str) -> Option<String> {
        self.vars
            .get(std::ffi::OsStr::new(name))
            .and_then(|v| v.to_str())
            .map(str::to_owned)
    }

    /// The first of `names` whose value is set but not UTF-8, as a message naming it and the
    /// fix.
    pub fn check_utf8<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
        for name in names {
            if let Some(v) = self.vars.get(std::ffi::OsStr::new(name)) {
                if v.to_str().is_none() {
                    return Err(format!(
                        "environment variable {name} is not valid UTF-8 ({:?}); set it to a UTF-8 value or unset it",
                        v.to_string_lossy()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// [`Env::check_utf8`] of the environment as it is now.
pub fn check_utf8<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
    Env::capture().check_utf8(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn names_the_variable_with_a_non_utf8_value() {
        // Names unique to this test: the process environment is shared by the test threads.
        std::env::set_var("REDIRECT_ENVIRON_TEST_OK", "10.0.0.0/8");
        std::env::set_var(
            "REDIRECT_ENVIRON_TEST_BAD",
            std::ffi::OsStr::from_bytes(b"10.0.0.0/8\xff"),
        );
        assert_eq!(
            check_utf8(["REDIRECT_ENVIRON_TEST_OK", "REDIRECT_ENVIRON_TEST_UNSET"]),
            Ok(())
        );
        let e = check_utf8(["REDIRECT_ENVIRON_TEST_OK", "REDIRECT_ENVIRON_TEST_BAD"]).unwrap_err();
        assert!(
            e.contains("REDIRECT_ENVIRON_TEST_BAD") && e.contains("10.0.0.0/8"),
            "{e}"
        );
        let env = Env::capture();
        assert_eq!(
            env.get("REDIRECT_ENVIRON_TEST_OK").as_deref(),
            Some("10.0.0.0/8")
        );
        assert_eq!(env.get("REDIRECT_ENVIRON_TEST_BAD"), None);
        assert_eq!(env.get("REDIRECT_ENVIRON_TEST_UNSET"), None);
    }
}
