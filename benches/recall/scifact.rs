//! The benchmark's texts, from BEIR SciFact: abstract sentences become
//! memories, claims become queries.
//!
//! The zip is read with `unzip -p` (no zip crate for one benchmark) and
//! parsed here: the CSV export quotes fields RFC 4180 style, and each
//! `abstract` is a NumPy-style list of Python string literals. The data is
//! never written anywhere by this program.

use std::collections::HashSet;
use std::process::Command;

use anyhow::{Context, bail};
use engram::domain::content::{content_hash, normalize};

/// Shortest sentence kept: the export splits some sentences after "+/-",
/// leaving fragments such as "0.24 versus 1.15 +/-".
const MIN_SENTENCE_CHARS: usize = 30;
/// Longest memory built from joined sentences.
const MAX_TEXT_CHARS: usize = 1_200;

pub struct Corpus {
    /// Distinct (by content hash) memory texts, in a fixed order.
    pub texts: Vec<String>,
    /// Distinct claims, in file order (validation, test, train).
    pub claims: Vec<String>,
}

fn read_member(zip: &str, member: &str) -> anyhow::Result<String> {
    let out = Command::new("unzip")
        .args(["-p", zip, member])
        .output()
        .with_context(|| format!("running `unzip -p {zip} {member}` (is unzip installed?)"))?;
    if !out.status.success() {
        bail!("`unzip -p {zip} {member}` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8(out.stdout).with_context(|| format!("{member} is not UTF-8"))
}

/// RFC 4180: comma-separated, double-quoted fields may hold commas, newlines
/// and doubled quotes.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            ',' => record.push(std::mem::take(&mut field)),
            '\r' => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            _ => field.push(c),
        }
    }
    if !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    records
}

/// The rows of a CSV member as (header → column index, rows).
fn read_csv(zip: &str, member: &str, columns: &[&str]) -> anyhow::Result<Vec<Vec<String>>> {
    let mut records = parse_csv(&read_member(zip, member)?).into_iter();
    let header = records.next().with_context(|| format!("{member} is empty"))?;
    let idx: Vec<usize> = columns
        .iter()
        .map(|c| header.iter().position(|h| h == c).with_context(|| format!("{member} has no column {c:?}")))
        .collect::<anyhow::Result<_>>()?;
    Ok(records.filter(|r| r.len() == header.len()).map(|r| idx.iter().map(|&i| r[i].clone()).collect()).collect())
}

/// The string literals of a Python/NumPy list repr: `['a' 'b'\n "c's"]`.
fn parse_py_strings(repr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = repr.chars();
    while let Some(c) = chars.next() {
        if c != '\'' && c != '"' {
            continue;
        }
        let quote = c;
        let mut s = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => s.push('\n'),
                    Some('t') => s.push('\t'),
                    Some('r') => s.push('\r'),
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        s.extend(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32));
                    }
                    Some('u') => {
                        let hex: String = chars.by_ref().take(4).collect();
                        s.extend(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32));
                    }
                    Some(other) => s.push(other),
                    None => break,
                },
                c if c == quote => break,
                c => s.push(c),
            }
        }
        out.push(s);
    }
    out
}

/// Reads the corpus and the claims. Memory texts: every sentence, every
/// two and three consecutive sentences of an abstract, and title + sentence,
/// deduplicated by content hash: about 150K distinct texts from 43K
/// sentences, enough for one agent of 100K memories with no repeat.
pub fn load(zip: &str) -> anyhow::Result<Corpus> {
    let docs = read_csv(zip, "corpus_train.csv", &["title", "abstract"])?;
    if docs.len() < 5_000 {
        bail!("{zip}: corpus_train.csv has {} documents, expected 5,183", docs.len());
    }
    let mut seen = HashSet::new();
    let mut singles = Vec::new();
    let mut pairs = Vec::new();
    let mut titled = Vec::new();
    let mut triples = Vec::new();
    for doc in &docs {
        let title = doc[0].trim();
        let sentences: Vec<String> = parse_py_strings(&doc[1])
            .into_iter()
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|s| s.chars().count() >= MIN_SENTENCE_CHARS)
            .collect();
        for (i, s) in sentences.iter().enumerate() {
            singles.push(s.clone());
            titled.push(format!("{title} {s}"));
            if let Some(next) = sentences.get(i + 1) {
                pairs.push(format!("{s} {next}"));
                if let Some(third) = sentences.get(i + 2) {
                    triples.push(format!("{s} {next} {third}"));
                }
            }
        }
    }
    let mut texts = Vec::new();
    for t in singles.into_iter().chain(pairs).chain(titled).chain(triples) {
        if t.chars().count() <= MAX_TEXT_CHARS && seen.insert(content_hash(&t)) {
            texts.push(t);
        }
    }

    let mut claims = Vec::new();
    let mut seen_claims = HashSet::new();
    for member in ["claims_validation.csv", "claims_test.csv", "claims_train.csv"] {
        for row in read_csv(zip, member, &["claim"])? {
            let claim = row[0].trim().to_string();
            if !claim.is_empty() && seen_claims.insert(normalize(&claim)) {
                claims.push(claim);
            }
        }
    }
    Ok(Corpus { texts, claims })
}
