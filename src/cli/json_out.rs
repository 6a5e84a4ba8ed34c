//! A minimal JSON writer for the stable `--json` outputs (`plan`, `check`, `doctor`,
//! `report`). Hand-written because the crate set is fixed; objects keep insertion order
//! so the documented field order is the printed one.

use std::fmt::Write;

pub enum Value {
    Null,
    Bool(bool),
    Num(i64),
    /// A time: Unix seconds with six decimals (the audit record's `ts` form), from
    /// microseconds.
    Secs(i64),
    Str(String),
    Arr(Vec<Value>),
    Obj(Vec<(&'static str, Value)>),
}

impl Value {
    pub fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }
    pub fn opt_str(s: Option<impl Into<String>>) -> Value {
        s.map_or(Value::Null, |s| Value::Str(s.into()))
    }
    pub fn opt_secs(us: Option<i64>) -> Value {
        us.map_or(Value::Null, Value::Secs)
    }
    pub fn opt_num(n: Option<impl Into<i64>>) -> Value {
        n.map_or(Value::Null, |n| Value::Num(n.into()))
    }

    /// Pretty-printed, two-space indent, trailing newline.
    pub fn pretty(&self) -> String {
        let mut s = String::new();
        self.write(&mut s, 0);
        s.push('\n');
        s
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = |out: &mut String, d: usize| out.push_str(&"  ".repeat(d));
        match self {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Num(n) => {
                let _ = write!(out, "{n}");
            }
            Value::Secs(us) => {
                let sign = if *us < 0 { "-" } else { "" };
                let a = us.unsigned_abs();
                let _ = write!(out, "{sign}{}.{:06}", a / 1_000_000, a % 1_000_000);
            }
            Value::Str(s) => escape(out, s),
            Value::Arr(items) if items.is_empty() => out.push_str("[]"),
            Value::Obj(items) if items.is_empty() => out.push_str("{}"),
            Value::Arr(items) => {
                out.push_str("[\n");
                for (i, v) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    v.write(out, depth + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, depth);
                out.push(']');
            }
            Value::Obj(items) => {
                out.push_str("{\n");
                for (i, (k, v)) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    escape(out, k);
                    out.push_str(": ");
                    v.write(out, depth + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, depth);
                out.push('}');
            }
        }
    }
}

/// `s` as a JSON string literal, escaped as the audit record escapes its strings (one
/// function: the core's `record::json_str`, uncapped).
fn escape(out: &mut String, s: &str) {
    // Writing to a String cannot fail.
    let _ = rankguard_core::record::json_str(out, s, usize::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_valid_json() {
        let v = Value::Obj(vec![
            ("a", Value::Num(-3)),
            ("b", Value::str("q\"\\\n\u{1}")),
            ("c", Value::Arr(vec![Value::Null, Value::Bool(true)])),
            ("d", Value::Arr(vec![])),
        ]);
        assert_eq!(v.pretty(), "{\n  \"a\": -3,\n  \"b\": \"q\\\"\\\\\\n\\u0001\",\n  \"c\": [\n    null,\n    true\n  ],\n  \"d\": []\n}\n");
    }
}
