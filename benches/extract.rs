//! Precision and recall of the rule-based fact reader (src/domain/extract)
//! per predicate on its labelled set, the held-out half (written before the
//! patterns) and the tuning half apart.
//!
//!   cargo bench --bench extract
//!   cargo bench --bench extract -- --show-errors
//!
//! A fact counts as right when its predicate is the label's and its object
//! equals the label's after lowercasing and trimming punctuation at both
//! ends. Prints tables, no assertions: the figures go to bench/RESULTS.md.

use std::collections::BTreeMap;

use engram::domain::extract::facts_in;
use serde::Deserialize;

const LABELLED: &str = include_str!("../tests/fixtures/extract/labelled.jsonl");
/// Leading lines written before any pattern (tests/fixtures/extract/README.md).
const HELD_OUT: usize = 147;

#[derive(Deserialize)]
struct Line {
    text: String,
    facts: Vec<Fact>,
}

#[derive(Deserialize, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Fact {
    predicate: String,
    object: String,
}

fn norm(s: &str) -> String {
    s.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase()
}

#[derive(Default)]
struct Counts {
    right: usize,
    extracted: usize,
    labelled: usize,
}

fn ratio(a: usize, b: usize) -> String {
    if b == 0 { "–".into() } else { format!("{:.3}", a as f64 / b as f64) }
}

fn main() {
    let show = std::env::args().any(|a| a == "--show-errors");
    let lines: Vec<Line> = LABELLED
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let mut table: BTreeMap<(&str, String), Counts> = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        let half = if i < HELD_OUT { "held-out" } else { "tuning" };
        let got: Vec<Fact> = facts_in(&line.text)
            .into_iter()
            .map(|f| Fact { predicate: f.predicate.into(), object: f.object })
            .collect();
        let key = |f: &Fact| (f.predicate.clone(), norm(&f.object));
        let want: Vec<(String, String)> = line.facts.iter().map(key).collect();
        let have: Vec<(String, String)> = got.iter().map(key).collect();
        for (p, o) in &have {
            for name in [p.as_str(), "all"] {
                let c = table.entry((half, name.to_string())).or_default();
                c.extracted += 1;
                if want.contains(&(p.clone(), o.clone())) {
                    c.right += 1;
                }
            }
        }
        for (p, _) in &want {
            for name in [p.as_str(), "all"] {
                table.entry((half, name.to_string())).or_default().labelled += 1;
            }
        }
        if show && have != want {
            eprintln!("{half} line {}: {:?}\n  want {want:?}\n  got  {have:?}", i + 1, line.text);
        }
    }
    println!("| half | predicate | right | extracted | labelled | precision | recall |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for ((half, predicate), c) in &table {
        println!(
            "| {half} | {predicate} | {} | {} | {} | {} | {} |",
            c.right,
            c.extracted,
            c.labelled,
            ratio(c.right, c.extracted),
            ratio(c.right, c.labelled)
        );
    }
}
