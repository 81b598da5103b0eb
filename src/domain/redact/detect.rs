//! The built-in detectors: one or more regular expressions per kind, each
//! followed by a check that the regular expression cannot express (a
//! checksum, a valid range, the characters around the match, a context word).
//!
//! Every detector proposes candidates independently; overlaps are settled by
//! the caller. A detector must never return a range that is not on character
//! boundaries, so ranges only ever come from regex matches or are moved by
//! whole ASCII characters.
//!
//! What each kind knowingly misses (the price of its precision):
//! - e-mail: addresses with a quoted local part or an IP-literal domain,
//!   and obfuscated ones ("jane at example dot com");
//! - phone: numbers without `+`/`00`, a trunk `0` or the North American
//!   shape unless a context word ("call", "phone", "tel", ...) comes just
//!   before them, so bare local numbers (`8747-4955`, Italian mobiles
//!   `3686462705`) pass without one, and so do 9-digit numbers run together
//!   after a trunk `0`; international dialling prefixes other than `00`
//!   (`0011`) unless a context word comes before them;
//! - card: without a card word just before it, a number not starting with 2
//!   to 6 or a 12-digit one outside Maestro's prefixes; unusual groupings;
//! - IBAN: lower-case IBANs, and ones split by dashes or irregular spaces;
//! - national id: only US social security numbers; the undashed form only
//!   after a context word, which can come from a neighbouring field;
//! - IP: dotted quads right after a version word, loopback, `0.x` and
//!   `255.x` addresses, networks written with a prefix length (`/8`), and
//!   IPv6 written without any digit;
//! - API key: vendors not listed here are left to the entropy rule;
//! - JWT: encrypted five-part tokens;
//! - secret and password: see `secrets.rs`.

use std::net::Ipv6Addr;
use std::str::FromStr;
use std::sync::LazyLock;

use regex::{Captures, Regex};

use super::secrets::{PASSWORD_PATTERN, check_entropy, check_password, check_password_value};
use super::{Finding, Kind};

type Check = fn(&str, &Captures<'_>) -> Option<(usize, usize)>;

struct Detector {
    kind: Kind,
    regex: Regex,
    check: Check,
}

/// The patterns, with their checks. Word boundaries (`\b`) are compiled as
/// ASCII boundaries: Unicode ones keep the regex engine off its fast paths
/// whenever the text is not pure ASCII, and the checks look at the
/// characters around each match with Unicode rules anyway. (A `RegexSet`
/// prefilter over all patterns was tried and cost more than it saved.)
static DETECTORS: LazyLock<Vec<Detector>> = LazyLock::new(|| {
    let specs: Vec<(Kind, &str, Check)> = vec![
        // E-mail: a local part and a dotted domain whose last label is
        // letters only, so `pkg@1.2.3` is not an address. Unicode letters are
        // allowed on both sides (internationalised addresses).
        (Kind::Email, r"[\p{L}\p{N}._%+-]+@(?:[\p{L}\p{N}](?:[\p{L}\p{N}-]*[\p{L}\p{N}])?\.)+\p{L}{2,24}", check_email),
        // Phone, international: `+` or `00`, a country code, then groups.
        // Digits are counted by the check (E.164 allows at most 15).
        (
            Kind::Phone,
            r"(?:\+|\b00)[1-9]\d{0,3}(?:[ .-]?(?:\(\d{1,5}\)|\d{1,6})){1,7}(?:[ ]?(?:x|ext\.?|#)[ ]?\d{1,6})?\b",
            check_phone_international,
        ),
        // Phone, North American: (555) 123-4567, 555-123-4567, 555.123.4567,
        // 555 123 4567, 1-800-555-0199, with an optional extension. The area
        // code starts with 2-9 as the numbering plan requires; the exchange
        // is left free because made-up examples (555-123-4567) break the
        // plan's rule for it and are still written as phone numbers.
        (
            Kind::Phone,
            r"(?:\b1[ .-]?)?(?:\([2-9]\d{2}\)[ ]?|\b[2-9]\d{2}[ .-])\d{3}[ .-]\d{4}(?:[ ]?(?:x|ext\.?)[ ]?\d{1,6})?\b",
            check_phone_national,
        ),
        // The same with the country code 1 written before it, which makes
        // the shape a phone number whatever the area code's first digit
        // (made-up numbers break the numbering plan: 1-190-558-6534).
        (
            Kind::Phone,
            r"\b1[ .-]?(?:\(\d{3}\)[ ]?|\d{3}[ .-])\d{3}[ .-]\d{4}(?:[ ]?(?:x|ext\.?)[ ]?\d{1,6})?\b",
            check_phone_national,
        ),
        // Phone, national with a trunk 0 (UK, DE, FR, IT, ...): 020 7946
        // 0958, 0171 1234567, (030) 1234567, 06 12 34 56 78, 030/1234567.
        (Kind::Phone, r"(?:\(0\d{1,4}\)[ -]?|\b0\d{1,4}[ ./-])\d{2,8}(?:[ ./-]\d{2,8}){0,3}\b", check_phone_trunk),
        // Phone, digits without the usual separators: only with a context
        // word before it ("call", "phone", "tel", ...); without one a bare
        // 10-digit number is as likely an order number or a timestamp.
        // Eight digits (`8747-4955`, `3783.2567`) are local numbers in many
        // countries and need the same context word.
        (
            Kind::Phone,
            r"\b\d{8,12}\b|\b\d{4}[ .-]\d{4}\b|\b\d{3}[ .-]\d{3}[ .-]\d{3,4}(?:[ ]?(?:x|ext\.?)[ ]?\d{1,6})?\b|\b\d{3} \d{2} \d{2} \d{2}\b",
            check_phone_context,
        ),
        // Phone, any national grouping after a context word: groups of
        // digits split by single spaces, dashes or dots, the first one
        // possibly bracketed (`2 345 678`, `(11) 2345-6789`, `70 12 34 56`,
        // `8 029 491-19-11`); the check wants 7 to 15 digits and no date.
        (
            Kind::Phone,
            r"(?:\(\d{1,5}(?: \d{1,3})?\)[ ]?|\b\d{1,5}[ .-])\d{1,9}(?:[ .-]\d{1,9}){0,4}\b",
            check_phone_grouped,
        ),
        // Phone, national, run together after a trunk 0 (`01418163671`,
        // `0122371731`): ten or eleven digits need no context word, unless
        // a word before says the number is something else.
        (Kind::Phone, r"\b0[1-9]\d{8,9}\b", check_phone_trunk_bare),
        // Payment card: 13 to 19 digits (12 for Maestro), optionally grouped
        // by spaces or dashes. The check wants usual groupings, an issuer's
        // prefix and a valid Luhn checksum.
        (Kind::Card, r"\b\d(?:[ -]?\d){11,18}\b", check_card),
        // IBAN: country, check digits, then the account in groups of four
        // (paper format) or run together (electronic format). The checksum
        // and the country's account format are checked by `iban_validate`.
        (Kind::Iban, r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,8}(?:[ ]?[A-Z0-9]{1,3})?\b", check_iban),
        // US social security number, dashed. Invalid ranges are excluded by
        // the check; the undashed nine digits need a context word.
        (Kind::NationalId, r"\b(\d{3})-(\d{2})-(\d{4})\b", check_ssn_dashed),
        (Kind::NationalId, r"\b(\d{3}) ?(\d{2}) ?(\d{4})\b", check_ssn_context),
        // IPv4: four octets of at most 255 without leading zeros.
        (
            Kind::IpAddress,
            r"\b(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\b",
            check_ipv4,
        ),
        // IPv6: a broad candidate that the standard library parses.
        (Kind::IpAddress, r"(?i)(?:[0-9a-f]{0,4}:){2,7}(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9a-f]{1,4})?", check_ipv6),
        // JWT: base64url header and payload that both begin with `{"`
        // (`eyJ`), and a signature. An unsigned token (`alg: none`) has no
        // third part and is caught without it.
        (Kind::Jwt, r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}(?:\.[A-Za-z0-9_-]{8,})?", check_plain),
        // API keys by their vendors' published prefixes. Only the generic
        // `sk-` needs more: the part after it must contain a digit, which
        // random keys do and words like `sk-learn-extensions` do not.
        (Kind::ApiKey, r"\bsk-[A-Za-z0-9_-]{20,}", check_sk_key),
        (Kind::ApiKey, r"\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{16,}", check_plain),
        (Kind::ApiKey, r"\bwhsec_[A-Za-z0-9+/=]{24,}", check_plain),
        (Kind::ApiKey, r"\bgh[pousr]_[A-Za-z0-9]{36,}", check_plain),
        (Kind::ApiKey, r"\bgithub_pat_[A-Za-z0-9_]{40,}", check_plain),
        (Kind::ApiKey, r"\bglpat-[A-Za-z0-9_-]{20,}", check_plain),
        (Kind::ApiKey, r"\bxox[abposr]-[A-Za-z0-9-]{10,}", check_plain),
        (Kind::ApiKey, r"\bxapp-\d-[A-Z0-9]+-\d+-[a-f0-9]+", check_plain),
        (Kind::ApiKey, r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA)[A-Z0-9]{16}\b", check_plain),
        (Kind::ApiKey, r"\bAIza[0-9A-Za-z_-]{35}", check_plain),
        (Kind::ApiKey, r"\bhf_[A-Za-z0-9]{30,}", check_plain),
        (Kind::ApiKey, r"\bnpm_[A-Za-z0-9]{36}\b", check_plain),
        (Kind::ApiKey, r"\bpypi-AgE[A-Za-z0-9_-]{50,}", check_plain),
        (Kind::ApiKey, r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}\b", check_plain),
        (Kind::ApiKey, r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b", check_plain),
        (Kind::ApiKey, r"\bdo[opr]_v1_[a-f0-9]{64}\b", check_plain),
        (Kind::ApiKey, r"\bkey-[0-9a-zA-Z]{32}\b", check_plain),
        (Kind::ApiKey, r"\bSK[0-9a-fA-F]{32}\b", check_plain),
        (Kind::ApiKey, r"\b\d{8,10}:AA[A-Za-z0-9_-]{33}\b", check_plain),
        // Webhook URLs are credentials in themselves: whoever has one can post.
        (
            Kind::ApiKey,
            r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]+|https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]+",
            check_plain,
        ),
        // Secrets found by what surrounds them: a private key block, and the
        // credential of an HTTP Authorization header or a bare Bearer token.
        (
            Kind::Secret,
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----",
            check_plain,
        ),
        (
            Kind::Secret,
            r"(?i)(?:\bauthorization\b[\x22']?\s*[:=]\s*[\x22']?(?:bearer|basic|token|digest)\s+|\bbearer\s+)([A-Za-z0-9._~+/-]{8,}=*)",
            check_group1,
        ),
        // Secrets found by entropy: long runs of base64 or base64url
        // characters that look random (see `check_entropy`).
        (Kind::Secret, r"[A-Za-z0-9+/_-]{20,}={0,2}", check_entropy),
        // Passwords and other credentials written as `key=value`,
        // `key: value`, `"key": "value"`, `--key value` or "the password is
        // value". Only the value is redacted.
        (Kind::Password, PASSWORD_PATTERN.as_str(), check_password),
        // Credentials inside a URL: scheme://user:password@host.
        (Kind::Password, r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:([^\s:/@]+)@", check_password_value),
    ];
    specs
        .into_iter()
        .map(|(kind, pattern, check)| Detector {
            kind,
            regex: Regex::new(&pattern.replace(r"\b", r"(?-u:\b)")).expect("built-in redaction pattern compiles"),
            check,
        })
        .collect()
});

/// Candidates of the enabled built-in kinds, unresolved.
pub(super) fn candidates(text: &str, enabled: &[Kind]) -> Vec<Finding> {
    let mut found = Vec::new();
    for detector in DETECTORS.iter() {
        if !enabled.contains(&detector.kind) {
            continue;
        }
        for caps in detector.regex.captures_iter(text) {
            if let Some((start, end)) = (detector.check)(text, &caps) {
                found.push(Finding { kind: detector.kind.clone(), start, end });
            }
        }
    }
    found
}

pub(super) fn whole(caps: &Captures<'_>) -> (usize, usize) {
    let m = caps.get(0).expect("group 0 always matches");
    (m.start(), m.end())
}

fn check_plain(_: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    Some(whole(caps))
}

fn check_group1(_: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    caps.get(1).map(|m| (m.start(), m.end()))
}

/// The character before `at`, if any.
pub(super) fn before(text: &str, at: usize) -> Option<char> {
    text[..at].chars().next_back()
}

/// The character at `at`, and the one after it.
pub(super) fn after(text: &str, at: usize) -> (Option<char>, Option<char>) {
    let mut rest = text[at..].chars();
    (rest.next(), rest.next())
}

/// True when the number at `start..end` continues on either side: a digit or
/// letter touching it, or a separator followed by another digit (`1.2.3.4.5`,
/// `12-34-56-78`), so the match is only part of a longer token.
fn glued(text: &str, start: usize, end: usize, separators: &[char]) -> bool {
    let prev = before(text, start);
    if prev.is_some_and(|c| c.is_alphanumeric() || c == '_') {
        return true;
    }
    if prev.is_some_and(|c| separators.contains(&c)) {
        let prev2 = text[..start].chars().rev().nth(1);
        if prev2.is_some_and(|c| c.is_ascii_digit()) {
            return true;
        }
    }
    let (next, next2) = after(text, end);
    if next.is_some_and(|c| c.is_alphanumeric() || c == '_') {
        return true;
    }
    next.is_some_and(|c| separators.contains(&c)) && next2.is_some_and(|c| c.is_ascii_digit())
}

/// Whether one of `words` appears among the last few words before `at`.
/// Words are compared whole and lowercased, so "tel" does not match "hotel".
fn context_before(text: &str, at: usize, words: &[&str]) -> bool {
    const WINDOW: usize = 40;
    let mut from = at.saturating_sub(WINDOW);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    text[from..at]
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .any(|word| words.iter().any(|w| word.eq_ignore_ascii_case(w) || word.to_lowercase() == *w))
}

pub(super) fn digits(s: &str) -> usize {
    s.bytes().filter(u8::is_ascii_digit).count()
}

// ---------------------------------------------------------------- e-mail

/// Image variants named `icon@2x.png` look like addresses; a "domain" ending
/// in a file extension is not one.
const FILE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "tiff", "avif", "pdf"];

fn check_email(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (mut start, end) = whole(caps);
    // The local part cannot begin with a dot or a sign; trim what the broad
    // class took from the surrounding text.
    while text[start..].starts_with(['.', '-', '+', '%']) {
        start += 1;
    }
    let at = start + text[start..end].find('@')?;
    if at == start {
        return None;
    }
    let (next, _) = after(text, end);
    if next.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '@') {
        return None;
    }
    let domain = &text[at + 1..end];
    let tld = domain.rsplit('.').next()?;
    if FILE_EXTENSIONS.iter().any(|ext| tld.eq_ignore_ascii_case(ext)) {
        return None;
    }
    // `postgres://app:pw@db.internal` and `ssh://deploy@host`: what comes
    // before the `@` of a URL's authority is a user name or a password
    // (found by the password detector), not an address.
    let token_start = text[..start].rfind(char::is_whitespace).map_or(0, |at| at + 1);
    if text[token_start..start].contains("://") {
        return None;
    }
    // `git@github.com:owner/repo` is an SSH remote, not someone's address.
    if &text[start..at] == "git" && next == Some(':') {
        return None;
    }
    Some((start, end))
}

// ---------------------------------------------------------------- phones

const PHONE_WORDS: &[&str] = &[
    "phone",
    "phones",
    "telephone",
    "tel",
    "mobile",
    "cell",
    "cellphone",
    "call",
    "calls",
    "called",
    "fax",
    "whatsapp",
    "sms",
    "text",
    "ring",
    "dial",
    "contact",
    "reach",
    "voicemail",
    "landline",
    "hotline",
    "helpline",
    "phoned",
    "calling",
    "texted",
    "mob",
    "telefoon",
    "mobiel",
    "telefone",
    "telemóvel",
    "tlf",
    "telefon",
    "telefonnummer",
    "handy",
    "téléphone",
    "tél",
    "portable",
    "móvil",
    "movil",
    "teléfono",
    "telefono",
    "cellulare",
];

/// Characters that continue a number on either side; a phone candidate next
/// to one of them followed by a digit is part of something longer.
const NUMBER_SEPARATORS: &[char] = &['.', '-', '/', ',', ':'];

/// Signs that say a number is an amount, an identifier or a reference (a
/// dash glued to a word or number before it), or a group of digits just
/// before it that makes it the tail of a longer
/// number (an account number, an IBAN with a bad checksum).
fn preceded_by_sign(text: &str, start: usize) -> bool {
    if before(text, start).is_some_and(|c| matches!(c, '#' | '$' | '€' | '£' | '¥' | '+' | '@' | '/' | '\\')) {
        return true;
    }
    // The tail of an identifier: `GP-00367-251`.
    let mut back = text[..start].chars().rev();
    if back.next() == Some('-') && back.next().is_some_and(char::is_alphanumeric) {
        return true;
    }
    let head = text[..start].strip_suffix(' ').unwrap_or("");
    let previous = head.rsplit(char::is_whitespace).next().unwrap_or("");
    !previous.is_empty() && previous.bytes().all(|b| b.is_ascii_digit())
}

fn check_phone_international(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    let number = &text[start..end];
    let body = strip_extension(number);
    if glued(text, start, end, NUMBER_SEPARATORS) || preceded_by_sign(text, start) {
        return None;
    }
    // A national trunk zero written in brackets after the country code,
    // +44 (0)20 ..., is not dialled and not counted.
    let count = digits(body) - usize::from(body.contains("(0)"));
    if !(8..=15).contains(&count) {
        return None;
    }
    // At most one group after a dot may be a single digit (an area code,
    // `+61.8.4625.2954`), or `+20.5 15.3 12.1` would pass for a number.
    let dotted_singles =
        body.split('.').skip(1).filter(|group| group.bytes().take_while(u8::is_ascii_digit).count() < 2).count();
    if dotted_singles > 1 {
        return None;
    }
    Some((start, end))
}

fn strip_extension(number: &str) -> &str {
    match number.find(['x', 'e', '#']) {
        Some(at) => number[..at].trim_end(),
        None => number,
    }
}

fn check_phone_national(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    if glued(text, start, end, NUMBER_SEPARATORS) || preceded_by_sign(text, start) {
        return None;
    }
    Some((start, end))
}

fn check_phone_trunk(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    let number = &text[start..end];
    if glued(text, start, end, NUMBER_SEPARATORS) || preceded_by_sign(text, start) {
        return None;
    }
    if !(9..=12).contains(&digits(number)) {
        return None;
    }
    // `00` starts an international number (the other pattern's), or a
    // national one behind a dialling prefix (`(0011) 998469`): only with a
    // context word.
    if (number.starts_with("00") || number.starts_with("(00")) && !context_before(text, start, PHONE_WORDS) {
        return None;
    }
    // One kind of separator, besides the space after a bracketed area code:
    // `01.02.2023 14` mixes dots and a space and is a date and a time.
    let mut separators: Vec<char> =
        number.replace(") ", ")").replace(")-", ")").chars().filter(|c| matches!(c, ' ' | '.' | '/' | '-')).collect();
    separators.dedup();
    separators.sort_unstable();
    separators.dedup();
    if separators.len() > 1 {
        return None;
    }
    // A date written with its year, 01.02.2023 or 05/06/2024, followed by
    // more digits.
    let groups: Vec<&str> = number.split([' ', '.', '/', '-']).collect();
    if groups.len() >= 3 && groups[0].len() <= 2 && groups[1].len() <= 2 && groups[2].len() == 4 {
        return None;
    }
    Some((start, end))
}

/// Words that make a number run together something other than a phone
/// number: a product, an order, an account or another reference.
const NOT_PHONE_WORDS: &[&str] = &[
    "isbn",
    "ean",
    "gtin",
    "upc",
    "imei",
    "sku",
    "order",
    "invoice",
    "ref",
    "reference",
    "account",
    "acct",
    "iban",
    "id",
    "serial",
    "tracking",
    "ticket",
    "case",
    "customer",
    "policy",
    "member",
    "code",
    "pin",
    "otp",
    "price",
    "costs",
    "cost",
    "total",
    "amount",
    "balance",
    "version",
    "build",
];

/// Whether, of the words in `yes` and `no`, the one nearest before `at`
/// (within `context_before`'s window) is in `yes`: "call about order
/// 1234 5678" names an order, "order questions: call 2345 6789" a phone.
fn nearest_says(text: &str, at: usize, yes: &[&str], no: &[&str]) -> bool {
    const WINDOW: usize = 40;
    let mut from = at.saturating_sub(WINDOW);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let is =
        |word: &str, words: &[&str]| words.iter().any(|w| word.eq_ignore_ascii_case(w) || word.to_lowercase() == *w);
    for word in text[from..at].split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).rev() {
        if is(word, yes) {
            return true;
        }
        if is(word, no) {
            return false;
        }
    }
    false
}

fn check_phone_trunk_bare(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    if glued(text, start, end, NUMBER_SEPARATORS) || preceded_by_sign(text, start) {
        return None;
    }
    if context_before(text, start, NOT_PHONE_WORDS) && !nearest_says(text, start, PHONE_WORDS, NOT_PHONE_WORDS) {
        return None;
    }
    Some((start, end))
}

fn check_phone_grouped(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    let number = &text[start..end];
    if !(7..=15).contains(&digits(number)) {
        return None;
    }
    // A bracketed three-digit area code is the North American shape, which
    // has ten digits: `(555) 123-45` is cut short, not another country's.
    let north_american = number.len() > 4 && number.as_bytes()[4] == b')' && digits(&number[..5]) == 3;
    if north_american && digits(number) != 10 {
        return None;
    }
    // A date with its year first or last (2024-01-15, 15.01.2024,
    // 01/15/2024 14), which a phone word nearby does not make a number.
    let groups: Vec<&str> = number.split([' ', '.', '-', '/']).collect();
    let year = |g: &str| g.len() == 4 && (g.starts_with("19") || g.starts_with("20"));
    let short = |g: &str| (1..=2).contains(&g.len());
    if groups.len() >= 3
        && (year(groups[0]) && short(groups[1]) && short(groups[2])
            || short(groups[0]) && short(groups[1]) && year(groups[2]))
    {
        return None;
    }
    check_phone_context(text, caps)
}

fn check_phone_context(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    if glued(text, start, end, NUMBER_SEPARATORS) || preceded_by_sign(text, start) {
        return None;
    }
    nearest_says(text, start, PHONE_WORDS, NOT_PHONE_WORDS).then_some((start, end))
}

// ---------------------------------------------------------------- cards

/// Words that say a Luhn-valid number is a product or device code.
const NOT_CARD_WORDS: &[&str] = &["ean", "isbn", "gtin", "upc", "imei", "sku", "barcode"];

/// Words that say a number is a payment card's, whatever its issuer prefix.
/// "Pay", "paid" and "payment" are left out: an order or invoice number
/// follows them as often as a card.
const CARD_WORDS: &[&str] = &[
    "card",
    "cards",
    "cc",
    "credit",
    "debit",
    "visa",
    "mastercard",
    "maestro",
    "amex",
    "jcb",
    "diners",
    "unionpay",
    "pan",
    "charge",
    "charged",
    "refund",
    "refunded",
    "karte",
    "kreditkarte",
    "carte",
    "tarjeta",
    "carta",
    "cartão",
    "kaart",
    "karta",
];

fn check_card(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    let candidate = &text[start..end];
    if candidate.contains(' ') && candidate.contains('-') || context_before(text, start, NOT_CARD_WORDS) {
        return None;
    }
    let named = context_before(text, start, CARD_WORDS);
    // Groups and where each begins, so a card can be found inside a longer
    // run of grouped digits (an order number before it, a year after it).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut group_start = start;
    for (offset, c) in candidate.char_indices() {
        if c == ' ' || c == '-' {
            groups.push((group_start, start + offset));
            group_start = start + offset + 1;
        }
    }
    groups.push((group_start, end));
    for len in (1..=groups.len()).rev() {
        for first in 0..=groups.len() - len {
            let span = (groups[first].0, groups[first + len - 1].1);
            let lens: Vec<usize> = groups[first..first + len].iter().map(|(s, e)| e - s).collect();
            if card_shape(&lens)
                && card_number(&text[span.0..span.1], named)
                && !glued(text, span.0, span.1, &['.', '-', ','])
            {
                return Some(span);
            }
        }
    }
    None
}

/// Usual groupings: run together, fours (the last group shorter for 13 and
/// 19-digit cards), or American Express and Diners' 4-6-5 and 4-6-4.
fn card_shape(lens: &[usize]) -> bool {
    match lens {
        [_] => true,
        [4, 6, 5] | [4, 6, 4] => true,
        [init @ .., last] => init.len() >= 3 && init.iter().all(|&l| l == 4) && (1..=4).contains(last),
        [] => false,
    }
}

/// Maestro's issuer prefixes, the only cards that can have 12 digits.
const MAESTRO_PREFIXES: &[&str] = &["5018", "5020", "5038", "5893", "6304", "6759", "6761", "6762", "6763"];

/// Whether a number can be a card's: its length, its issuer prefix and its
/// Luhn checksum. `named`: a card word comes just before it, which vouches
/// for any prefix and for 12 digits (Maestro issues 12 to 19, and its
/// ranges have moved over the years).
fn card_number(number: &str, named: bool) -> bool {
    let count = digits(number);
    let plain: String = number.chars().filter(char::is_ascii_digit).collect();
    let maestro = MAESTRO_PREFIXES.iter().any(|prefix| plain.starts_with(prefix));
    if !((13..=19).contains(&count) || count == 12 && (maestro || named)) {
        return false;
    }
    // Issuers' numbers begin with 2 to 6 (Mastercard's 2-series, Amex,
    // Visa, Mastercard, Maestro, Discover and UnionPay). Leading 1s are
    // where millisecond timestamps and many database ids live.
    let first = plain.as_bytes()[0];
    (named || (b'2'..=b'6').contains(&first)) && luhn::valid(number)
}

// ---------------------------------------------------------------- IBAN

fn check_iban(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, mut end) = whole(caps);
    // The paper format's last group can be followed by an upper-case word
    // that the pattern takes for another group; drop trailing groups until
    // the rest validates.
    for _ in 0..3 {
        let candidate = &text[start..end];
        if candidate.parse::<iban::Iban>().is_ok() {
            return Some((start, end));
        }
        end = start + candidate.rfind(' ')?;
    }
    None
}

// ---------------------------------------------------------------- SSN

const SSN_WORDS: &[&str] = &["ssn", "ssns", "social", "security", "ss"];

fn ssn_valid(caps: &Captures<'_>) -> bool {
    let area = &caps[1];
    let group = &caps[2];
    let serial = &caps[3];
    area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
}

fn check_ssn_dashed(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    if !ssn_valid(caps) || glued(text, start, end, &['-', '.', '/']) {
        return None;
    }
    Some((start, end))
}

fn check_ssn_context(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    // `)` too: `+31(0)189 486354` is a phone number, whatever field
    // name came before it.
    if !ssn_valid(caps) || glued(text, start, end, &['-', '.', '/', ' ', ')']) {
        return None;
    }
    if !context_before(text, start, SSN_WORDS) {
        return None;
    }
    Some((start, end))
}

// ---------------------------------------------------------------- IP

/// Words that make a dotted quad a version number rather than an address.
const VERSION_WORDS: &[&str] = &[
    "version",
    "versions",
    "ver",
    "v",
    "release",
    "build",
    "firmware",
    "driver",
    "update",
    "section",
    "chapter",
    "step",
    "clause",
    "paragraph",
    "item",
    "rule",
    "figure",
    "table",
    "oid",
    "rv",
];

fn check_ipv4(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    let address = &text[start..end];
    if glued(text, start, end, &['.']) {
        return None;
    }
    // Loopback, "this network" and netmasks say nothing about anyone.
    if address.starts_with("127.") || address.starts_with("0.") || address.starts_with("255.") {
        return None;
    }
    // `10.0.0.0/8` names a network, not a host.
    if text[end..].starts_with('/') && text[end + 1..].starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let recent = text[..start].trim_end_matches(|c: char| !c.is_alphanumeric());
    let last_word = recent.rsplit(|c: char| !c.is_alphanumeric()).next().unwrap_or("");
    if VERSION_WORDS.iter().any(|w| last_word.eq_ignore_ascii_case(w)) {
        return None;
    }
    Some((start, end))
}

fn check_ipv6(text: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    let candidate = &text[start..end];
    if before(text, start).is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '.') {
        return None;
    }
    let (next, _) = after(text, end);
    if next.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
        return None;
    }
    let address = Ipv6Addr::from_str(candidate).ok()?;
    if address.is_unspecified() || address.is_loopback() {
        return None;
    }
    // `a::b` in code parses as an address; real ones written by people
    // carry digits.
    if !candidate.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((start, end))
}

// ---------------------------------------------------------------- keys

fn check_sk_key(_: &str, caps: &Captures<'_>) -> Option<(usize, usize)> {
    let (start, end) = whole(caps);
    caps[0][3..].bytes().any(|b| b.is_ascii_digit()).then_some((start, end))
}
