//! JSON: a small strict parser for one line, enough to read audit records back
//! ([`crate::record`]). The crate set is fixed (no serde); the CLI's writer is
//! `cli/json_out.rs`.

#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Nesting deeper than this is not an audit record; refusing it bounds the recursion.
const MAX_DEPTH: usize = 32;

/// Parse one complete JSON value (surrounding whitespace allowed, nothing after it).
pub fn parse_json(text: &str) -> Result<Json, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!(
            "unexpected '{}' after the JSON value at byte {}",
            p.peek_char(),
            p.i + 1
        ));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\r' | b'\n') {
            self.i += 1;
        }
    }
    fn peek_char(&self) -> char {
        std::str::from_utf8(&self.s[self.i..])
            .ok()
            .and_then(|t| t.chars().next())
            .unwrap_or('?')
    }
    fn eof(&self) -> String {
        "the line ends inside a JSON value".to_string()
    }
    fn expect(&mut self, b: u8) -> Result<(), String> {
        match self.s.get(self.i) {
            Some(&c) if c == b => {
                self.i += 1;
                Ok(())
            }
            Some(_) => Err(format!(
                "expected '{}' at byte {}, found '{}'",
                b as char,
                self.i + 1,
                self.peek_char()
            )),
            None => Err(self.eof()),
        }
    }
    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        match self.s.get(self.i) {
            None => Err(self.eof()),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Json::Str),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(format!(
                "unexpected '{}' at byte {}",
                self.peek_char(),
                self.i + 1
            )),
        }
    }
    fn word(&mut self, w: &str, v: Json) -> Result<Json, String> {
        let end = self.i + w.len();
        if end <= self.s.len() && &self.s[self.i..end] == w.as_bytes() {
            self.i = end;
            Ok(v)
        } else if end > self.s.len() && w.as_bytes().starts_with(&self.s[self.i..]) {
            Err(self.eof())
        } else {
            Err(format!(
                "unexpected '{}' at byte {}",
                self.peek_char(),
                self.i + 1
            ))
        }
    }
    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        let digits = |p: &mut Self| {
            let s = p.i;
            while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                p.i += 1;
            }
            p.i - s
        };
        if digits(self) == 0 {
            return Err(format!("malformed number at byte {}", start + 1));
        }
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            if digits(self) == 0 {
                return Err(format!("malformed number at byte {}", start + 1));
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return Err(format!("malformed number at byte {}", start + 1));
            }
        }
        // The slice is ASCII digits, signs, '.', 'e': valid UTF-8 and a valid f64 literal.
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
        text.parse::<f64>()
            .map(Json::Num)
            .map_err(|e| format!("malformed number '{text}': {e}"))
    }
    fn hex4(&mut self) -> Result<u32, String> {
        if self.i + 4 > self.s.len() {
            return Err(self.eof());
        }
        let t = std::str::from_utf8(&self.s[self.i..self.i + 4])
            .map_err(|_| "bad \\u escape".to_string())?;
        let v = u32::from_str_radix(t, 16).map_err(|_| format!("bad \\u escape '\\u{t}'"))?;
        self.i += 4;
        Ok(v)
    }
    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len()
                && !matches!(self.s[self.i], b'"' | b'\\')
                && self.s[self.i] >= 0x20
            {
                self.i += 1;
            }
            out.push_str(
                std::str::from_utf8(&self.s[start..self.i])
                    .map_err(|_| "a string is not valid UTF-8".to_string())?,
            );
            match self.s.get(self.i) {
                None => return Err(self.eof()),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let Some(&e) = self.s.get(self.i) else {
                        return Err(self.eof());
                    };
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                if self.s.get(self.i) != Some(&b'\\')
                                    || self.s.get(self.i + 1) != Some(&b'u')
                                {
                                    return Err("unpaired surrogate in a \\u escape".into());
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err("unpaired surrogate in a \\u escape".into());
                                }
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                            } else {
                                char::from_u32(hi)
                            };
                            out.push(c.ok_or("invalid \\u escape")?);
                        }
                        _ => {
                            return Err(format!("bad escape '\\{}' at byte {}", e as char, self.i))
                        }
                    }
                }
                Some(_) => {
                    return Err(format!(
                        "raw control character in a string at byte {}",
                        self.i + 1
                    ))
                }
            }
        }
    }
    fn array(&mut self, depth: usize) -> Result<Json, String> {
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.ws();
        if self.s.get(self.i) == Some(&b']') {
            self.i += 1;
            return Ok(Json::Arr(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                None => return Err(self.eof()),
                Some(_) => return Err(format!("expected ',' or ']' at byte {}", self.i + 1)),
            }
        }
    }
    fn object(&mut self, depth: usize) -> Result<Json, String> {
        self.expect(b'{')?;
        let mut items = Vec::new();
        self.ws();
        if self.s.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Ok(Json::Obj(items));
        }
        loop {
            self.ws();
            let k = self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            let v = self.value(depth + 1)?;
            items.push((k, v));
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Json::Obj(items));
                }
                None => return Err(self.eof()),
                Some(_) => return Err(format!("expected ',' or '}}' at byte {}", self.i + 1)),
            }
        }
    }
}
