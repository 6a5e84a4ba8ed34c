//! The raw stage of argument parsing: split `argv` into flags, their values and the
//! command to run. Each subcommand then validates what it got into typed options (the second
//! stage), as ripgrep's lowargs/hiargs do. No crate: the grammar is small and its errors
//! must name the flag and the fix.
//!
//! Grammar: `--flag value`, `--flag=value`, short flags only as whole words (`-h`), `--`
//! ends the options, and for commands that take one, the first word that is not an option
//! starts the command (`rankguard launch --nproc-per-node 2 python train.py`).

use super::exit::{Error, Result};
use std::ffi::OsString;

/// One raw token.
#[derive(Debug, PartialEq, Eq)]
pub enum Token {
    /// `--name` or `-x` (the `=value` part, if any, waits for [`Lexer::value`]).
    Flag(String),
    /// A word that is not an option (the start of the command).
    Word(OsString),
    /// `--`.
    End,
}

pub struct Lexer {
    args: Vec<OsString>,
    pos: usize,
    /// The `value` of a `--flag=value` just returned.
    inline: Option<OsString>,
    cmd: &'static str,
}

impl Lexer {
    pub fn new(cmd: &'static str, args: Vec<OsString>) -> Lexer {
        Lexer {
            args,
            pos: 0,
            inline: None,
            cmd,
        }
    }

    pub fn next(&mut self) -> Result<Option<Token>> {
        if let Some(v) = self.inline.take() {
            return Err(Error::usage(format!(
                "rankguard {}: a flag does not take a value ('={}')",
                self.cmd,
                v.to_string_lossy()
            )));
        }
        let Some(arg) = self.args.get(self.pos).cloned() else {
            return Ok(None);
        };
        self.pos += 1;
        let Some(text) = arg.to_str() else {
            return Ok(Some(Token::Word(arg)));
        };
        if text == "--" {
            return Ok(Some(Token::End));
        }
        if let Some(long) = text.strip_prefix("--") {
            if let Some((name, value)) = long.split_once('=') {
                self.inline = Some(OsString::from(value));
                return Ok(Some(Token::Flag(format!("--{name}"))));
            }
            return Ok(Some(Token::Flag(text.to_string())));
        }
        if text.len() > 1 && text.starts_with('-') {
            return Ok(Some(Token::Flag(text.to_string())));
        }
        Ok(Some(Token::Word(arg)))
    }

    /// The value of the flag just returned, as UTF-8.
    pub fn value(&mut self, flag: &str) -> Result<String> {
        let v = match self.inline.take() {
            Some(v) => v,
            None => {
                let Some(v) = self.args.get(self.pos).cloned() else {
                    return Err(Error::usage(format!(
                        "rankguard {}: {flag} needs a value",
                        self.cmd
                    )));
                };
                self.pos += 1;
                v
            }
        };
        v.into_string().map_err(|v| {
            Error::usage(format!(
                "rankguard {}: {flag} '{}' is not valid UTF-8",
                self.cmd,
                v.to_string_lossy()
            ))
        })
    }

    /// Everything after the current position (the command and its arguments).
    pub fn rest(&mut self) -> Vec<OsString> {
        let out = self.args[self.pos..].to_vec();
        self.pos = self.args.len();
        out
    }

    pub fn unknown(&self, flag: &str) -> Error {
        Error::usage(format!(
            "rankguard {}: unknown option '{flag}' (rankguard {} --help)",
            self.cmd, self.cmd
        ))
    }
}

/// Parse a number flag, naming the flag on failure.
pub fn number<T: std::str::FromStr>(cmd: &str, flag: &str, text: &str, what: &str) -> Result<T> {
    text.trim()
        .parse::<T>()
        .map_err(|_| Error::usage(format!("rankguard {cmd}: {flag} '{text}' is not {what}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lex(words: &[&str]) -> Lexer {
        Lexer::new("t", words.iter().map(OsString::from).collect())
    }

    #[test]
    fn flags_values_and_the_command() {
        let mut l = lex(&["--a", "1", "--b=2", "-h", "cmd", "--x"]);
        assert_eq!(l.next().unwrap(), Some(Token::Flag("--a".into())));
        assert_eq!(l.value("--a").unwrap(), "1");
        assert_eq!(l.next().unwrap(), Some(Token::Flag("--b".into())));
        assert_eq!(l.value("--b").unwrap(), "2");
        assert_eq!(l.next().unwrap(), Some(Token::Flag("-h".into())));
        assert_eq!(l.next().unwrap(), Some(Token::Word("cmd".into())));
        assert_eq!(l.rest(), vec![OsString::from("--x")]);
        assert_eq!(l.next().unwrap(), None);
    }

    #[test]
    fn double_dash_and_errors() {
        let mut l = lex(&["--", "-x"]);
        assert_eq!(l.next().unwrap(), Some(Token::End));
        assert_eq!(l.rest(), vec![OsString::from("-x")]);
        let mut l = lex(&["--a"]);
        l.next().unwrap();
        assert!(l
            .value("--a")
            .unwrap_err()
            .msg
            .contains("--a needs a value"));
        let mut l = lex(&["--json=yes"]);
        l.next().unwrap();
        assert!(l.next().unwrap_err().msg.contains("does not take a value"));
        assert!(number::<u32>("t", "--n", "x", "a count")
            .unwrap_err()
            .msg
            .contains("--n 'x' is not a count"));
    }
}
