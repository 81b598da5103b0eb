//! Precision and recall of the redaction module (src/domain/redact.rs) per
//! kind on a labelled corpus, and the time to redact a 2 KB text.
//!
//!   cargo bench --bench redaction                       # the held-out corpus
//!   cargo bench --bench redaction -- --corpus FILE.jsonl --show-errors
//!
//! A finding counts as a true positive when its kind and its exact text match
//! an expected one; the "overlap" columns count a finding of the right kind
//! whose range overlaps an expected one, which forgives a different choice of
//! where a match ends (an extension, a trailing group). Prints tables, no
//! assertions: the figures go to bench/RESULTS.md by hand.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use engram::domain::redact::{Kind, RedactionRules, Redactor};
use serde::Deserialize;

#[derive(Deserialize)]
struct Snippet {
    text: String,
    expect: Vec<Expected>,
}

#[derive(Deserialize)]
struct Expected {
    kind: String,
    #[serde(rename = "match")]
    matched: String,
}

#[derive(Default)]
struct Counts {
    tp: usize,
    fp: usize,
    fn_: usize,
    overlap_tp: usize,
    overlap_fn: usize,
}

/// Byte ranges of every occurrence of `needle` in `text`.
fn occurrences(text: &str, needle: &str) -> Vec<(usize, usize)> {
    text.match_indices(needle).map(|(at, s)| (at, at + s.len())).collect()
}

fn main() {
    let mut corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/redaction/holdout.jsonl");
    let mut show_errors = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--corpus" => corpus = PathBuf::from(args.next().expect("--corpus needs a file")),
            "--show-errors" => show_errors = true,
            // cargo bench passes --bench to every bench target.
            _ => {}
        }
    }
    let source = std::fs::read_to_string(&corpus).unwrap_or_else(|err| panic!("reading {}: {err}", corpus.display()));
    let snippets: Vec<Snippet> = source
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("bad line {line}: {err}")))
        .collect();
    let redactor = Redactor::new(&RedactionRules::default()).expect("default rules compile");

    let mut per_kind: BTreeMap<String, Counts> = BTreeMap::new();
    for kind in Kind::BUILTIN {
        per_kind.insert(kind.name().to_owned(), Counts::default());
    }
    let (mut negatives, mut negatives_flagged, mut positives) = (0, 0, 0);
    for snippet in &snippets {
        let findings = redactor.find(&snippet.text);
        let found: Vec<(String, usize, usize)> =
            findings.iter().map(|f| (f.kind.name().to_owned(), f.start, f.end)).collect();
        if snippet.expect.is_empty() {
            negatives += 1;
            negatives_flagged += usize::from(!found.is_empty());
        } else {
            positives += 1;
        }
        let mut exact_used = vec![false; found.len()];
        let mut overlap_used = vec![false; found.len()];
        for expected in &snippet.expect {
            let counts = per_kind.entry(expected.kind.clone()).or_default();
            let spans = occurrences(&snippet.text, &expected.matched);
            let exact = found
                .iter()
                .enumerate()
                .position(|(i, (kind, s, e))| !exact_used[i] && *kind == expected.kind && spans.contains(&(*s, *e)));
            match exact {
                Some(i) => {
                    exact_used[i] = true;
                    counts.tp += 1;
                }
                None => {
                    counts.fn_ += 1;
                    if show_errors {
                        println!(
                            "MISSED {} {:?} in {:?} -> {:?}",
                            expected.kind,
                            expected.matched,
                            snippet.text,
                            found_text(&snippet.text, &found)
                        );
                    }
                }
            }
            let overlap = found.iter().enumerate().position(|(i, (kind, s, e))| {
                !overlap_used[i] && *kind == expected.kind && spans.iter().any(|(a, b)| s < b && a < e)
            });
            match overlap {
                Some(i) => {
                    overlap_used[i] = true;
                    counts.overlap_tp += 1;
                }
                None => counts.overlap_fn += 1,
            }
        }
        for (i, (kind, s, e)) in found.iter().enumerate() {
            if !exact_used[i] {
                per_kind.entry(kind.clone()).or_default().fp += 1;
                if show_errors {
                    println!("EXTRA {kind} {:?} in {:?}", &snippet.text[*s..*e], snippet.text);
                }
            }
        }
    }

    println!(
        "corpus: {} ({} snippets: {} positive, {} negative)",
        corpus.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned()),
        snippets.len(),
        positives,
        negatives
    );
    println!();
    println!("| kind | expected | TP | FP | FN | precision | recall | recall (overlap) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut total = Counts::default();
    for (kind, c) in &per_kind {
        println!(
            "| {kind} | {} | {} | {} | {} | {} | {} | {} |",
            c.tp + c.fn_,
            c.tp,
            c.fp,
            c.fn_,
            ratio(c.tp, c.tp + c.fp),
            ratio(c.tp, c.tp + c.fn_),
            ratio(c.overlap_tp, c.overlap_tp + c.overlap_fn)
        );
        total.tp += c.tp;
        total.fp += c.fp;
        total.fn_ += c.fn_;
        total.overlap_tp += c.overlap_tp;
        total.overlap_fn += c.overlap_fn;
    }
    println!(
        "| all | {} | {} | {} | {} | {} | {} | {} |",
        total.tp + total.fn_,
        total.tp,
        total.fp,
        total.fn_,
        ratio(total.tp, total.tp + total.fp),
        ratio(total.tp, total.tp + total.fn_),
        ratio(total.overlap_tp, total.overlap_tp + total.overlap_fn)
    );
    println!();
    println!(
        "negative snippets with any finding: {negatives_flagged} of {negatives} ({})",
        ratio(negatives_flagged, negatives)
    );

    // Timing: a 2 KB text made of corpus snippets (findings included),
    // redacted many times; the median of the runs.
    let mut text = String::new();
    for snippet in snippets.iter().cycle().take(snippets.len() * 4) {
        if text.len() + snippet.text.len() + 1 > 2048 {
            continue;
        }
        text.push_str(&snippet.text);
        text.push('\n');
    }
    let mut times = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let started = Instant::now();
        let redacted = redactor.redact(&text);
        std::hint::black_box(redacted);
        times.push(started.elapsed());
    }
    times.sort();
    println!();
    println!(
        "redacting {} bytes: median {:?}, p99 {:?} over {} runs",
        text.len(),
        times[times.len() / 2],
        times[times.len() * 99 / 100],
        times.len()
    );
}

fn found_text(text: &str, found: &[(String, usize, usize)]) -> Vec<String> {
    found.iter().map(|(kind, s, e)| format!("{kind}:{}", &text[*s..*e])).collect()
}

fn ratio(numerator: usize, denominator: usize) -> String {
    if denominator == 0 { "-".to_owned() } else { format!("{:.3}", numerator as f64 / denominator as f64) }
}
