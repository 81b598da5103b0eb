//! Real BPE token counts (tiktoken's `cl100k_base` and `o200k_base`, loaded
//! from the crate, no network).

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;
use utoipa::ToSchema;

use super::context::Tokenizer;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-4 and GPT-3.5 models.
    #[default]
    Cl100kBase,
    /// GPT-4o and later models.
    O200kBase,
}

#[derive(Clone)]
pub struct Bpe(Arc<CoreBPE>);

impl Bpe {
    /// The encoder, built once per process (building takes a moment).
    pub fn new(encoding: Encoding) -> Bpe {
        static CL100K: OnceLock<Arc<CoreBPE>> = OnceLock::new();
        static O200K: OnceLock<Arc<CoreBPE>> = OnceLock::new();
        let bpe = match encoding {
            Encoding::Cl100kBase => {
                CL100K.get_or_init(|| Arc::new(tiktoken_rs::cl100k_base().expect("bundled cl100k_base loads")))
            }
            Encoding::O200kBase => {
                O200K.get_or_init(|| Arc::new(tiktoken_rs::o200k_base().expect("bundled o200k_base loads")))
            }
        };
        Bpe(bpe.clone())
    }
}

impl Tokenizer for Bpe {
    fn count(&self, text: &str) -> usize {
        self.0.encode_ordinary(text).len()
    }

    /// The number of whitespace-separated words. Both encodings first split
    /// the text with a pattern whose pieces never span whitespace (a piece
    /// may only start with one whitespace character, before its word), and
    /// BPE merges only within a piece: every word costs at least one token.
    fn at_least(&self, text: &str) -> usize {
        text.split_whitespace().count()
    }

    fn truncate(&self, text: &str, max_tokens: usize) -> String {
        let tokens = self.0.encode_ordinary(text);
        if tokens.len() <= max_tokens {
            return text.to_string();
        }
        // A cut can split a multi-byte character; step back until it decodes.
        let mut n = max_tokens;
        loop {
            if let Ok(s) = self.0.decode(&tokens[..n]) {
                return s;
            }
            if n == 0 {
                return String::new();
            }
            n -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_never_counts_fewer_tokens_than_words() {
        let texts = [
            "The user prefers dark mode and aisle seats.",
            "a b c d e f g",
            "Flight LH1234 on 2024-05-03 at 07:45 — gate B12, seat 14C!",
            "  spaced\tout\n\nwords  with \u{a0}no-break spaces ",
            "naïve café Ünïcödé 東京タワー 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 e\u{301}e\u{301} \u{301}\u{301}",
            "'s 't 're ... !!! ??? 123456789 ===== ---",
            "",
        ];
        for encoding in [Encoding::Cl100kBase, Encoding::O200kBase] {
            let bpe = Bpe::new(encoding);
            for text in texts {
                let (least, count) = (bpe.at_least(text), bpe.count(text));
                assert!(least <= count, "{encoding:?} {text:?}: at least {least}, counted {count}");
            }
            assert_eq!(bpe.at_least("a b c d e f g"), bpe.count("a b c d e f g"));
        }
    }

    #[test]
    fn both_encodings_count_like_tiktoken() {
        // Reference count from tiktoken: 9 tokens in both encodings.
        let text = "The user prefers dark mode and aisle seats.";
        assert_eq!(Bpe::new(Encoding::Cl100kBase).count("The user prefers dark mode and aisle seats."), 9);
        assert_eq!(Bpe::new(Encoding::O200kBase).count(text), 9);
        let bpe = Bpe::new(Encoding::Cl100kBase);
        let cut = bpe.truncate(text, 3);
        assert_eq!(bpe.count(&cut), 3);
        assert!(text.starts_with(&cut));
    }
}
