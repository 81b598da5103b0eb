//! The detectors that cannot lean on a checksum or a fixed format: long
//! random-looking strings (`check_entropy`) and credentials recognised by
//! the key written before them (`check_password`). Both trade recall for
//! precision with explicit rules, each written next to the code; they must
//! stay conservative about ordinary prose and code, which mention passwords
//! and tokens far more often than they contain them.
//!
//! Known misses: hex-only secrets without a key before them, random
//! strings that start with two of `-` and `/`, tokens shorter than the
//! length threshold, passwords in prose made of letters only ("the password
//! is swordfish"), passwords that end in `)` inside a bracket the text
//! opened before them, or contain a space or comma outside quotes, and
//! credentials named by a key not in `CREDENTIAL_KEY`.

use std::sync::LazyLock;

use regex::{Captures, Regex};

use super::detect::{after, before, digits, whole};

// ---------------------------------------------------------------- entropy

/// Long random-looking runs of base64 characters are taken for secrets:
///
/// - at least 20 characters (padding aside), with an upper-case letter, a
///   lower-case letter and a digit, or, for lower-case-and-digit tokens, at
///   least 32 characters with four digits;
/// - hexadecimal runs are not secrets here: they are mostly git SHAs,
///   content hashes and UUIDs written about in code and logs, and a hex key
///   is still caught by its `key=value` context;
/// - not made of words: identifiers such as `parseUserConfigV2FromEnv` have
///   most of their characters in word-like runs and many vowels, random
///   text has few of either (about one letter in five is a vowel); the
///   thresholds were set so that nearly all random base62 tokens pass;
/// - Shannon entropy over the characters of at least 3.5 bits;
/// - a path is judged segment by segment; an inline file (`base64,` before
///   it) is skipped, and so is base64 that decodes to readable text without
///   a colon (encoded prose, not `user:password`).
pub(super) fn check_entropy(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    let token = &text[start..end];
    let (next, next2) = after(text, end);
    if next.is_some_and(|c| c.is_alphanumeric() || c == '@')
        || (next == Some('.') && next2.is_some_and(char::is_alphanumeric))
    {
        return None;
    }
    if text[..start].ends_with("base64,") {
        return None;
    }
    // A run glued to a word or a dotted name is part of something longer;
    // only its path segments after the first can still stand alone.
    let glued_before =
        before(text, start).is_some_and(|c| c.is_alphanumeric() || c == '.' || c == '@' || c == '%' || c == '\\');
    // A path or a URL's path: judge each segment on its own, so the token
    // in `/join/Zk8Qm3Tn7Wp2Xr5Yb9Lc4` is found and the words around it
    // are not.
    let is_path = token.contains('/')
        && token
            .split('/')
            .any(|seg| seg.len() >= 4 && seg.bytes().all(|b| b.is_ascii_lowercase() || b == b'-' || b == b'_'));
    if is_path {
        let mut offset = start;
        let mut best: Option<(usize, usize)> = None;
        for (index, seg) in token.split('/').enumerate() {
            let usable = index > 0 || !glued_before;
            if usable && random_looking(seg) && best.is_none_or(|(s, e)| e - s < seg.len()) {
                best = Some((offset, offset + seg.len()));
            }
            offset += seg.len() + 1;
        }
        return best;
    }
    if glued_before {
        return None;
    }
    random_looking(token).then_some((start, end))
}

fn random_looking(token: &str) -> bool {
    let core = token.trim_end_matches('=');
    // Base64 has `/` and base64url `-` in its alphabet, so a random token may
    // begin with one; two in a row begin an option (`--flag`) or a path.
    let core = match core.strip_prefix(['/', '-']) {
        Some(rest) if rest.starts_with(['/', '-']) => return false,
        Some(rest) => rest,
        None => core,
    };
    if core.len() < 20 || core.ends_with('-') {
        return false;
    }
    if core.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return false;
    }
    let upper = core.bytes().filter(u8::is_ascii_uppercase).count();
    let lower = core.bytes().filter(u8::is_ascii_lowercase).count();
    let digit = digits(core);
    let classes_ok = (upper > 0 && lower > 0 && digit > 0) || (lower > 0 && digit >= 4 && core.len() >= 32);
    if !classes_ok {
        return false;
    }
    let letters = upper + lower;
    let vowels = core.bytes().filter(|b| b"aeiouAEIOU".contains(b)).count();
    if letters > 0 && vowels as f64 / letters as f64 > 0.4 {
        return false;
    }
    if wordiness(core) > 0.65 || shannon_entropy(core) < 3.5 {
        return false;
    }
    if let Some(decoded) = decode_base64(core) {
        let printable = decoded.iter().filter(|b| b.is_ascii_graphic() || **b == b' ').count();
        if printable == decoded.len() && decoded.contains(&b' ') && !decoded.contains(&b':') {
            return false;
        }
    }
    true
}

fn wordiness(s: &str) -> f64 {
    let bytes = s.as_bytes();
    let mut in_words = 0;
    let mut i = 0;
    while i < bytes.len() {
        let run_start = i;
        if bytes[i].is_ascii_uppercase() {
            i += 1;
        }
        let lower_start = i;
        while i < bytes.len() && bytes[i].is_ascii_lowercase() {
            i += 1;
        }
        if i - lower_start >= 2 && i - run_start >= 3 {
            in_words += i - run_start;
        }
        if i == run_start {
            i += 1;
        }
    }
    in_words as f64 / bytes.len() as f64
}

fn shannon_entropy(s: &str) -> f64 {
    let mut counts = [0u32; 256];
    for b in s.bytes() {
        counts[usize::from(b)] += 1;
    }
    let len = s.len() as f64;
    counts
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| {
            let p = f64::from(n) / len;
            -p * p.log2()
        })
        .sum()
}

/// Standard or URL-safe base64 without padding checks; `None` when the text
/// is not base64.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in s.bytes() {
        let value = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

// ---------------------------------------------------------------- passwords

/// A key that names a credential. Keys are matched whole: `db_password`,
/// `DB_PASSWORD`, `dbPassword`, `"password"`, `--password`, but not
/// `max_tokens` or `compass`; only the unambiguous words may have a prefix
/// glued on (`PGPASSWORD`, `rootpassword`).
const CREDENTIAL_KEY: &str = r"(?x)
    (?i-u: (?: [a-z0-9]+ [_.-] )*
        (?: [a-z0-9]* (?: password | passwd | passphrase ) | pwd | pass | pw | secret | client[_-]?secret
          | secret[_-]?key | api[_-]?key | apikey | access[_-]?key | private[_-]?key
          | signing[_-]?key | encryption[_-]?key | master[_-]?key
          | token | auth[_-]?token | access[_-]?token | refresh[_-]?token | session[_-]?token
          | credentials? ) )
  | [a-z] [a-zA-Z0-9]* (?: Password | Passwd | Passphrase | Secret | Token | ApiKey | AccessKey | SecretKey | PrivateKey )
";

/// A credential's key, then its value: `key=value`, `key: value`,
/// `"key": "value"`, `--key value` or "the password is value". The value is
/// a quoted string or a run up to white space, a comma or a semicolon:
/// generated passwords are full of `&`, `(` and `$`, so those are kept, and
/// the check cuts a URL query's value at its `&`.
pub(super) static PASSWORD_PATTERN: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"(?x) \b (?: {CREDENTIAL_KEY} ) \b
    ["']?
    (?:
        [\x20\t]* (?: := | => | [:=] ) [\x20\t]*
      | [\x20\t]+ (?i-u: is | was ) [\x20\t]+ (?: (?i-u: set [\x20\t]+ to | now ) [\x20\t]+ )?
      | \x20
    )
    (?:
        "(?P<dq>[^"\r\n]{{1,200}})"
      | '(?P<sq>[^'\r\n]{{1,200}})'
      | `(?P<bq>[^`\r\n]{{1,200}})`
      | (?P<bare>[^\s"'`,;]{{1,200}})
    )
"#
    )
});

static CREDENTIAL_KEY_WHOLE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("^(?:{CREDENTIAL_KEY})$")).expect("credential key pattern compiles"));

/// Whether a field name (a JSON key) names a credential, so that its whole
/// value is one.
pub(super) fn is_credential_key(key: &str) -> bool {
    CREDENTIAL_KEY_WHOLE.is_match(key)
}

/// Whether a field's whole value can be redacted as a credential: not a
/// placeholder, a reference or a type name.
pub(super) fn is_credential_value(value: &str) -> bool {
    check_value(value)
}

/// Values that are not secrets: empty and masked values, placeholders and
/// references to where the secret really is, booleans, and type names from
/// declarations such as `password: String`.
const NOT_A_VALUE: &[&str] = &[
    "none",
    "null",
    "nil",
    "true",
    "false",
    "undefined",
    "required",
    "optional",
    "str",
    "string",
    "bytes",
    "int",
    "bool",
    "text",
    "varchar",
    "char",
    "secretstring",
    "secret",
    "redacted",
    "hidden",
    "masked",
    "omitted",
    "empty",
    "unset",
    "n/a",
    "na",
    "tbd",
    "todo",
    "value",
    "xxx",
    "your_password",
    "your_token",
];

/// Words that follow "password is" in ordinary prose.
const PROSE_AFTER_IS: &[&str] = &[
    "incorrect",
    "wrong",
    "invalid",
    "expired",
    "reset",
    "correct",
    "set",
    "saved",
    "stored",
    "missing",
    "required",
    "empty",
    "weak",
    "strong",
    "too",
    "not",
    "a",
    "an",
    "the",
    "still",
    "now",
    "case",
    "different",
    "same",
    "being",
    "changed",
    "updated",
    "valid",
    "shown",
    "hidden",
    "sent",
    "encrypted",
    "hashed",
    "long",
    "short",
    "in",
    "on",
    "at",
];

pub(super) fn check_password(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let whole_match = caps.get(0)?;
    let quoted = caps.name("dq").or_else(|| caps.name("sq")).or_else(|| caps.name("bq"));
    let value = quoted.or_else(|| caps.name("bare"))?;
    let (start, mut end) = (value.start(), value.end());
    let key_and_sep = &text[whole_match.start()..start];
    let key = key_and_sep.trim_end_matches(|c: char| !c.is_alphanumeric()).to_ascii_lowercase();
    let lead = key_and_sep.trim_end().to_ascii_lowercase();
    let prose = [" is", " was", " to", " now"].iter().any(|w| lead.ends_with(w));
    let spaced = !prose && !key_and_sep.contains([':', '=', '>']);
    // `--password hunter2` on a command line; elsewhere a key and a word
    // after a space is prose ("password reset").
    if spaced && !text[..whole_match.start()].ends_with("--") {
        return None;
    }
    if quoted.is_none() {
        // In a URL's query string the next parameter starts at `&`.
        let token_start = text[..whole_match.start()].rfind(char::is_whitespace).map_or(0, |at| at + 1);
        if text[token_start..whole_match.start()].ends_with(['?', '&']) {
            end = start + text[start..end].find('&').unwrap_or(end - start);
        }
        // A closing bracket that the value does not open, but the text
        // before it does, is not part of it, nor is a sentence's full stop:
        // "(pwd: abc123)", "is hunter2.". With no bracket open before it,
        // the bracket is the password's own last character: "pwd: a$cy7Sz)".
        loop {
            let value = &text[start..end];
            let unbalanced = [(')', '('), (']', '['), ('}', '{')].iter().any(|&(close, open)| {
                let opened = text[..start].matches(open).count() > text[..start].matches(close).count();
                value.ends_with(close) && !value.contains(open) && opened
            });
            if end > start + 1 && (unbalanced || value.ends_with('.')) {
                end -= 1;
            } else {
                break;
            }
        }
        let value = &text[start..end];
        // In code, the value of `token = self.token` or
        // `password = get_password()` is an expression, not a secret.
        if is_code_expression(value) || is_dotted_path(value) {
            return None;
        }
        // "Keep this secret: the party is on Friday" is a sentence going
        // on after the colon, not a key and its value.
        let (next, next2) = after(text, end);
        if key_and_sep.contains(':')
            && value.chars().all(char::is_alphabetic)
            && next == Some(' ')
            && next2.is_some_and(char::is_lowercase)
        {
            return None;
        }
        if prose || spaced {
            // "the password is wrong": only values that look like a
            // password (a digit or a symbol) are taken from prose.
            let lower = value.to_lowercase();
            if PROSE_AFTER_IS.contains(&lower.as_str()) || value.chars().all(char::is_alphabetic) {
                return None;
            }
        }
    }
    let value = &text[start..end];
    // `password=password` passes a variable of the same name.
    let last_word = key.rsplit(['_', '-', '.']).next().unwrap_or(&key);
    if value.eq_ignore_ascii_case(&key) || value.eq_ignore_ascii_case(last_word) {
        return None;
    }
    check_value(value).then_some((start, end))
}

pub(super) fn check_password_value(_: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let value = caps.get(1)?;
    check_value(value.as_str()).then_some((value.start(), value.end()))
}

fn check_value(value: &str) -> bool {
    if value.is_empty() || value.chars().all(|c| c == '*' || c == 'x' || c == 'X' || c == '•' || c == '.') {
        return false;
    }
    if is_reference(value) {
        return false;
    }
    let lower = value.to_lowercase();
    if NOT_A_VALUE.contains(&lower.as_str())
        || lower.starts_with("os.environ")
        || lower.starts_with("process.env")
        || lower.starts_with("env:")
    {
        return false;
    }
    // Type names in declarations: `Option<String>`, `&str`, `&[u8]`,
    // `&SecretString`. A generated password can start with `&` too, so only
    // what reads as a Rust reference type is skipped.
    let reference_type = value.strip_prefix('&').is_some_and(|rest| {
        rest.starts_with("str")
            || rest.starts_with(['[', '\''])
            || rest.starts_with("mut ")
            || rest.starts_with(|c: char| c.is_ascii_uppercase()) && rest.chars().all(|c| c.is_ascii_alphabetic())
    });
    if value.contains('<') || reference_type {
        return false;
    }
    true
}

/// References and placeholders: `$DB_PASSWORD`, `${{ secrets.TOKEN }}`,
/// `$(cat file)`, `{{ password }}`, `<your password>`, `%(password)s`,
/// `%PASSWORD%`, and this module's own `[password]`, so redacting twice
/// changes nothing. A value that merely starts with `$` or `%` is a
/// password like any other.
fn is_reference(value: &str) -> bool {
    let identifier = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let wrapped = |open: char, close: char| value.starts_with(open) && value.ends_with(close);
    value.starts_with("${")
        || value.starts_with("$(")
        || value.strip_prefix('$').is_some_and(identifier)
        || value.starts_with("{{")
        || value.starts_with("%(")
        || value.len() > 2 && wrapped('%', '%') && identifier(&value[1..value.len() - 1])
        || wrapped('{', '}')
        || wrapped('<', '>')
        || wrapped('[', ']')
}

/// `get_password()`, `getpass.getpass("Password: ")`, `env["TOKEN"]`: a call
/// or an index, not a value.
fn is_code_expression(value: &str) -> bool {
    let Some(open) = value.find(['(', '[']) else {
        return false;
    };
    let callee = &value[..open];
    !callee.is_empty()
        && callee.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && callee.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        && value.ends_with([')', ']', '(', '['])
}

/// `self.token`, `config.db.password`, `settings.SECRET_KEY`: names, not values.
fn is_dotted_path(value: &str) -> bool {
    value.contains('.')
        && value.split('.').all(|part| {
            part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && part.chars().any(|c| c.is_ascii_lowercase())
        })
        && !value.chars().any(|c| c.is_ascii_digit())
}
