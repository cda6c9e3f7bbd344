//! Go's string forms, which Istio's inputs follow.

/// Go's `strconv.ParseBool`, which Istio uses for every boolean flag, variable and env value.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}
