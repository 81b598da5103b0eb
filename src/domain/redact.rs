//! Redaction of personal data and secrets from text before one agent's
//! memories are shared with another: e-mail addresses, phone numbers, payment
//! cards, IBANs, US social security numbers, IP addresses, API keys, JWTs,
//! other high-entropy secrets and passwords written as `key=value`. Each
//! finding is replaced by a placeholder naming what was removed (`[email]`),
//! and everything else is left byte for byte as it was.
//!
//! Rules are per tenant: every built-in kind can be switched off, and a tenant
//! can add its own patterns (`extra`), each with its own placeholder name.
//!
//! This module is pure: no I/O, no HTTP, no storage. It must not log or keep
//! what it finds; callers get the redacted text and a count per kind only.
//! Detection is deliberately rule-based (regular expressions, checksums and a
//! few context words) so its behaviour is predictable and testable; it is a
//! safety net, not a guarantee. The detectors and what each knowingly
//! misses are in `detect.rs` (structured kinds) and `secrets.rs` (entropy
//! and `key=value` credentials). A labelled corpus under
//! `tests/fixtures/redaction/` measures them (`cargo bench --bench
//! redaction`).

mod detect;
mod secrets;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

/// What a finding is. Built-in kinds come first; `Custom` carries the name of
/// a tenant's extra pattern. Serialised as its bare name (`"email"`,
/// `"employee_id"`), which is also the word inside the placeholder.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Kind {
    Email,
    Phone,
    Card,
    Iban,
    NationalId,
    IpAddress,
    ApiKey,
    Jwt,
    Secret,
    Password,
    Custom(String),
}

impl Kind {
    /// Every built-in kind, in the order used to report them.
    pub const BUILTIN: [Kind; 10] = [
        Kind::Email,
        Kind::Phone,
        Kind::Card,
        Kind::Iban,
        Kind::NationalId,
        Kind::IpAddress,
        Kind::ApiKey,
        Kind::Jwt,
        Kind::Secret,
        Kind::Password,
    ];

    pub fn name(&self) -> &str {
        match self {
            Kind::Email => "email",
            Kind::Phone => "phone",
            Kind::Card => "card",
            Kind::Iban => "iban",
            Kind::NationalId => "national_id",
            Kind::IpAddress => "ip_address",
            Kind::ApiKey => "api_key",
            Kind::Jwt => "jwt",
            Kind::Secret => "secret",
            Kind::Password => "password",
            Kind::Custom(name) => name,
        }
    }

    /// The text that replaces a finding: `[email]`, `[api_key]`, `[employee_id]`.
    pub fn placeholder(&self) -> String {
        format!("[{}]", self.name())
    }

    /// When two findings overlap, the lower rank wins, whatever their lengths:
    /// a kind recognised by its structure or checksum (a JWT, a key prefix, a
    /// Luhn-valid card) says more than one recognised by context or entropy,
    /// so `password=eyJ…` is reported as a JWT and a key inside a longer
    /// base64-looking run as an API key. An IBAN outranks a card because an
    /// IBAN's digit groups can pass Luhn by chance, never the reverse. Tenant patterns rank below the
    /// structured kinds, so a broad tenant pattern cannot cut an e-mail
    /// address in half and leave the rest visible, but above the entropy
    /// guess.
    fn rank(&self) -> u8 {
        match self {
            Kind::Jwt => 0,
            Kind::ApiKey => 1,
            Kind::Iban => 2,
            Kind::Card => 3,
            Kind::NationalId => 4,
            Kind::Email => 5,
            Kind::IpAddress => 6,
            Kind::Phone => 7,
            Kind::Password => 8,
            Kind::Custom(_) => 9,
            Kind::Secret => 10,
        }
    }

    fn builtin(name: &str) -> Option<Kind> {
        Kind::BUILTIN.into_iter().find(|kind| kind.name() == name)
    }
}

impl From<Kind> for String {
    fn from(kind: Kind) -> String {
        kind.name().to_owned()
    }
}

impl From<String> for Kind {
    fn from(name: String) -> Kind {
        Kind::builtin(&name).unwrap_or(Kind::Custom(name))
    }
}

/// A tenant's redaction rules. Every built-in kind is on unless switched off;
/// unknown fields are rejected so a misspelt kind is not silently ignored.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedactionRules {
    pub email: bool,
    pub phone: bool,
    pub card: bool,
    pub iban: bool,
    pub national_id: bool,
    pub ip_address: bool,
    pub api_key: bool,
    pub jwt: bool,
    pub secret: bool,
    pub password: bool,
    /// The tenant's own patterns, each redacted as `[<name>]`.
    pub extra: Vec<ExtraPattern>,
}

impl Default for RedactionRules {
    fn default() -> Self {
        RedactionRules {
            email: true,
            phone: true,
            card: true,
            iban: true,
            national_id: true,
            ip_address: true,
            api_key: true,
            jwt: true,
            secret: true,
            password: true,
            extra: Vec::new(),
        }
    }
}

impl RedactionRules {
    /// Whether a kind is redacted. A custom kind is on when the tenant has a
    /// pattern of that name.
    pub fn enabled(&self, kind: &Kind) -> bool {
        match kind {
            Kind::Email => self.email,
            Kind::Phone => self.phone,
            Kind::Card => self.card,
            Kind::Iban => self.iban,
            Kind::NationalId => self.national_id,
            Kind::IpAddress => self.ip_address,
            Kind::ApiKey => self.api_key,
            Kind::Jwt => self.jwt,
            Kind::Secret => self.secret,
            Kind::Password => self.password,
            Kind::Custom(name) => self.extra.iter().any(|extra| &extra.name == name),
        }
    }

    /// Switches a built-in kind on or off; custom kinds are added through
    /// `extra` instead.
    pub fn set(&mut self, kind: &Kind, on: bool) {
        let slot = match kind {
            Kind::Email => &mut self.email,
            Kind::Phone => &mut self.phone,
            Kind::Card => &mut self.card,
            Kind::Iban => &mut self.iban,
            Kind::NationalId => &mut self.national_id,
            Kind::IpAddress => &mut self.ip_address,
            Kind::ApiKey => &mut self.api_key,
            Kind::Jwt => &mut self.jwt,
            Kind::Secret => &mut self.secret,
            Kind::Password => &mut self.password,
            Kind::Custom(_) => return,
        };
        *slot = on;
    }
}

/// A tenant's extra pattern: a regular expression (Rust `regex` syntax) and
/// the name its placeholder carries. When the pattern has a group named
/// `value`, only that group is redacted (`badge: (?P<value>\d{6})` keeps the
/// word "badge").
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExtraPattern {
    pub name: String,
    pub pattern: String,
}

/// Bounds on tenant patterns: they are compiled for every redactor built
/// from the rules, so neither their number nor their compiled size is left
/// open.
const MAX_EXTRA_PATTERNS: usize = 32;
const MAX_NAME_LEN: usize = 32;
const MAX_PATTERN_SIZE: usize = 1 << 20;

/// One finding: its kind and its byte range in the text. Ranges always fall
/// on character boundaries because they come from regex matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub kind: Kind,
    pub start: usize,
    pub end: usize,
}

/// Redacted text and how many findings of each kind were replaced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Redacted {
    pub text: String,
    pub applied: BTreeMap<Kind, usize>,
}

/// A compiled set of rules. Built once per tenant's rules and reused: the
/// built-in patterns are compiled once per process, only the tenant's extra
/// patterns are compiled here.
#[derive(Clone, Debug)]
pub struct Redactor {
    builtin: Vec<Kind>,
    extra: Vec<(Kind, Regex)>,
}

impl Redactor {
    /// Validates and compiles the rules. The error names the offending
    /// pattern and says what is wrong with it.
    pub fn new(rules: &RedactionRules) -> Result<Redactor, String> {
        if rules.extra.len() > MAX_EXTRA_PATTERNS {
            return Err(format!("at most {MAX_EXTRA_PATTERNS} extra patterns are allowed, got {}", rules.extra.len()));
        }
        let mut extra = Vec::with_capacity(rules.extra.len());
        for pattern in &rules.extra {
            let name = &pattern.name;
            let valid_name = !name.is_empty()
                && name.len() <= MAX_NAME_LEN
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !valid_name {
                return Err(format!(
                    "extra pattern name {name:?} must be 1 to {MAX_NAME_LEN} characters of a-z, 0-9 and _, starting with a letter"
                ));
            }
            if Kind::builtin(name).is_some() {
                return Err(format!("extra pattern name {name:?} is the name of a built-in kind"));
            }
            if extra.iter().any(|(kind, _): &(Kind, Regex)| kind.name() == name) {
                return Err(format!("extra pattern name {name:?} is used twice"));
            }
            let regex = RegexBuilder::new(&pattern.pattern)
                .size_limit(MAX_PATTERN_SIZE)
                .build()
                .map_err(|err| format!("extra pattern {name:?} is not a valid regular expression: {err}"))?;
            // A pattern that can match nothing would report empty findings
            // everywhere and redact nothing.
            if regex.is_match("") {
                return Err(format!("extra pattern {name:?} matches the empty string"));
            }
            extra.push((Kind::Custom(name.clone()), regex));
        }
        let builtin = Kind::BUILTIN.into_iter().filter(|kind| rules.enabled(kind)).collect();
        Ok(Redactor { builtin, extra })
    }

    /// All findings in `text`, ordered by position, none overlapping.
    pub fn find(&self, text: &str) -> Vec<Finding> {
        let mut candidates = detect::candidates(text, &self.builtin);
        for (kind, regex) in &self.extra {
            for caps in regex.captures_iter(text) {
                let Some(m) = caps.name("value").or_else(|| caps.get(0)) else {
                    continue;
                };
                if !m.is_empty() {
                    candidates.push(Finding { kind: kind.clone(), start: m.start(), end: m.end() });
                }
            }
        }
        resolve(candidates)
    }

    /// Replaces every finding by its placeholder.
    pub fn redact(&self, text: &str) -> Redacted {
        let findings = self.find(text);
        let mut out = String::with_capacity(text.len());
        let mut applied = BTreeMap::new();
        let mut at = 0;
        for finding in findings {
            out.push_str(&text[at..finding.start]);
            out.push_str(&finding.kind.placeholder());
            at = finding.end;
            *applied.entry(finding.kind).or_insert(0) += 1;
        }
        out.push_str(&text[at..]);
        Redacted { text: out, applied }
    }

    /// Redacts every string leaf of a JSON value in place (metadata, tool
    /// output). Object keys are left alone: they name fields, and changing
    /// them would change the document's shape. A string field whose key
    /// names a credential (`"password"`, `"api_key"`, `"dbPassword"`) is a
    /// credential as a whole, unless a more specific kind covers it.
    /// Returns the counts per kind.
    pub fn redact_json(&self, value: &mut serde_json::Value) -> BTreeMap<Kind, usize> {
        let mut applied = BTreeMap::new();
        self.redact_json_into(value, &mut applied);
        applied
    }

    fn redact_json_into(&self, value: &mut serde_json::Value, applied: &mut BTreeMap<Kind, usize>) {
        match value {
            serde_json::Value::String(text) => {
                let redacted = self.redact(text);
                if !redacted.applied.is_empty() {
                    *text = redacted.text;
                    for (kind, count) in redacted.applied {
                        *applied.entry(kind).or_insert(0) += count;
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    self.redact_json_into(item, applied);
                }
            }
            serde_json::Value::Object(fields) => {
                for (key, item) in fields.iter_mut() {
                    if let serde_json::Value::String(text) = item
                        && self.builtin.contains(&Kind::Password)
                        && secrets::is_credential_key(key)
                        && secrets::is_credential_value(text)
                        && self.find(text).is_empty()
                    {
                        *text = Kind::Password.placeholder();
                        *applied.entry(Kind::Password).or_insert(0) += 1;
                        continue;
                    }
                    self.redact_json_into(item, applied);
                }
            }
            serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {}
        }
    }
}

/// Keeps one finding wherever candidates overlap: the lowest rank first, then
/// the longest, then the earliest. A candidate that overlaps one already kept
/// is dropped whole.
fn resolve(mut candidates: Vec<Finding>) -> Vec<Finding> {
    candidates.sort_by(|a, b| {
        a.kind.rank().cmp(&b.kind.rank()).then((b.end - b.start).cmp(&(a.end - a.start))).then(a.start.cmp(&b.start))
    });
    // Kept findings by start; they never overlap, so the neighbours of a new
    // candidate in start order are the only ones it can collide with.
    let mut kept: BTreeMap<usize, Finding> = BTreeMap::new();
    for candidate in candidates {
        let before = kept.range(..candidate.end).next_back();
        if before.is_some_and(|(_, f)| f.end > candidate.start) {
            continue;
        }
        kept.insert(candidate.start, candidate);
    }
    kept.into_values().collect()
}
