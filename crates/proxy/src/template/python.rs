//! Python's view of template values: `str()` / `repr()` for `{{ value }}` output and
//! `json.dumps` for HF's `tojson` filter.
//!
//! Python jinja2 prints values with `str()` (`None`, `True`, `1.0`, `{'a': 1}`) where minijinja
//! would print `none`, `true` and JSON-ish maps; HF transformers replaces jinja2's `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`. Both are
//! reproduced here so a rendered prompt is byte-identical to `apply_chat_template`.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `json.dumps` options (HF `tojson` arguments).
#[derive(Clone, Debug, Default)]
pub struct DumpsOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(text)`: newline + `text` repeated per level.
    pub indent: Option<String>,
    /// `(item separator, key separator)`; default `(", ", ": ")`, or `(",", ": ")` with indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// Python `float.__repr__`: the shortest round-trip digits, scientific notation when the
/// decimal exponent is below -4 or at least 16, a two-digit exponent minimum (`1e-05`).
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let scientific = format!("{:e}", x.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("LowerExp output always has an exponent");
    let exponent: i32 = exponent.parse().expect("LowerExp exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let body = if exponent >= 0 {
            let integer_len = exponent as usize + 1;
            if digits.len() <= integer_len {
                format!("{digits}{}.0", "0".repeat(integer_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..integer_len], &digits[integer_len..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exponent - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let mantissa = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exponent_sign}{:02}", exponent.abs())
    }
}

fn number_text(value: &Value) -> String {
    if value.is_integer() {
        match i128::try_from(value.clone()) {
            Ok(integer) => integer.to_string(),
            Err(_) => value.to_string(),
        }
    } else {
        match f64::try_from(value.clone()) {
            Ok(float) => float_repr(float),
            Err(_) => value.to_string(),
        }
    }
}

/// Python `str(value)`, as jinja2 prints `{{ value }}`.
pub fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => python_repr(value),
    }
}

/// Python `repr(value)` for the value kinds a chat template sees.
pub fn python_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_text(value)),
        ValueKind::String => write_string_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Bytes => {
            out.push('b');
            let text = String::from_utf8_lossy(value.as_bytes().unwrap_or_default()).into_owned();
            write_string_repr(out, &text);
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (index, key) in keys.enumerate() {
                    if index > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key);
                    out.push_str(": ");
                    write_repr(out, &value.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = value.is_tuple();
            out.push(if tuple { '(' } else { '[' });
            let mut count = 0;
            if let Ok(items) = value.try_iter() {
                for item in items {
                    if count > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item);
                    count += 1;
                }
            }
            if tuple && count == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// Characters Python's `str.isprintable()` rejects, beyond ASCII controls: the separators
/// and format characters a chat template could plausibly meet. (Python uses the full Unicode
/// database; unassigned and private-use code points are printed here unescaped.)
fn python_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() {
        return false;
    }
    !matches!(
        c,
        '\u{a0}'
            | '\u{ad}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200f}'
            | '\u{2028}'..='\u{202f}'
            | '\u{205f}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{3000}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

fn write_string_repr(out: &mut String, text: &str) {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if python_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
}

/// Python `json.dumps(value, ...)`.
pub fn dumps(value: &Value, options: &DumpsOptions) -> Result<String, Error> {
    let (item_separator, key_separator) = match &options.separators {
        Some((item, key)) => (item.clone(), key.clone()),
        None if options.indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut writer = Dumper {
        out: String::new(),
        options,
        item_separator,
        key_separator,
    };
    writer.value(value, 0)?;
    Ok(writer.out)
}

struct Dumper<'a> {
    out: String,
    options: &'a DumpsOptions,
    item_separator: String,
    key_separator: String,
}

/// jinja2 (like Python) refuses to serialise nesting deeper than the interpreter's recursion
/// limit; this bound keeps a hostile value from exhausting the stack.
const DUMPS_DEPTH_MAX: usize = 500;

impl Dumper<'_> {
    fn newline(&mut self, level: usize) {
        if let Some(indent) = &self.options.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(indent);
            }
        }
    }

    fn value(&mut self, value: &Value, level: usize) -> Result<(), Error> {
        if level > DUMPS_DEPTH_MAX {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: maximum recursion depth exceeded",
            ));
        }
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if value.is_integer() {
                    self.out.push_str(&number_text(value));
                } else {
                    let float = f64::try_from(value.clone())?;
                    self.out.push_str(&if float.is_nan() {
                        "NaN".to_string()
                    } else if float.is_infinite() {
                        if float > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
                    } else {
                        float_repr(float)
                    });
                }
            }
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        let separator = self.item_separator.clone();
                        self.out.push_str(&separator);
                    }
                    self.newline(level + 1);
                    self.value(item, level + 1)?;
                }
                self.newline(level);
                self.out.push(']');
            }
            ValueKind::Map => {
                let mut pairs: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    pairs.push((self.key_text(&key)?, item));
                }
                if self.options.sort_keys {
                    pairs.sort_by(|left, right| left.0.cmp(&right.0));
                }
                if pairs.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                self.out.push('{');
                for (index, (key, item)) in pairs.iter().enumerate() {
                    if index > 0 {
                        let separator = self.item_separator.clone();
                        self.out.push_str(&separator);
                    }
                    self.newline(level + 1);
                    self.string(key);
                    let separator = self.key_separator.clone();
                    self.out.push_str(&separator);
                    self.value(item, level + 1)?;
                }
                self.newline(level);
                self.out.push('}');
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: Object of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    /// Python converts non-string keys: `True` → `"true"`, `None` → `"null"`, numbers as text.
    fn key_text(&self, key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::None => "null".to_string(),
            ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
            ValueKind::Number => number_text(key),
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
                ))
            }
        })
    }

    fn string(&mut self, text: &str) {
        self.out.push('"');
        for c in text.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.options.ensure_ascii && (c as u32) > 0x7e => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}
