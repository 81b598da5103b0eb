//! Real BPE token counts in OpenAI's `cl100k_base` and `o200k_base`
//! encodings, from the `bpe-openai` crate (its tables are built into the
//! binary, no network). It splits text with the encodings' own patterns,
//! rewritten without look-around for a faster regex engine, and counts each
//! piece without building its token list; its tokens equal tiktoken's (the
//! tests compare them), at a fraction of the cost. Counting is the largest
//! part of packing a context.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::context::{Tokenizer, for_each_word};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-4 and GPT-3.5 models.
    #[default]
    Cl100kBase,
    /// GPT-4o and later models.
    O200kBase,
}

#[derive(Clone, Copy)]
pub struct Bpe(&'static bpe_openai::Tokenizer);

impl Bpe {
    /// The encoder; its tables are read once per process, on first use.
    pub fn new(encoding: Encoding) -> Bpe {
        Bpe(match encoding {
            Encoding::Cl100kBase => bpe_openai::cl100k_base(),
            Encoding::O200kBase => bpe_openai::o200k_base(),
        })
    }
}

impl Tokenizer for Bpe {
    fn count(&self, text: &str) -> usize {
        self.0.count(text)
    }

    /// The number of whitespace-separated words. Both encodings first split
    /// the text with a pattern whose pieces never span whitespace (a piece
    /// may only start with one whitespace character, before its word), and
    /// BPE merges only within a piece: every word costs at least one token.
    fn at_least(&self, text: &str) -> usize {
        let mut words = 0;
        for_each_word(text, |_| words += 1);
        words
    }

    fn truncate(&self, text: &str, max_tokens: usize) -> String {
        let tokens = self.0.encode(text);
        if tokens.len() <= max_tokens {
            return text.to_string();
        }
        // A cut can split a multi-byte character; step back until it decodes.
        let mut n = max_tokens;
        loop {
            if let Some(s) = self.0.decode(&tokens[..n]) {
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

    /// tiktoken's own tokens (`tiktoken-rs`, its regex with look-ahead and
    /// merges), for the texts that stress the split: every kind of character
    /// its patterns tell apart, in random runs, and in both encodings.
    #[test]
    fn tokens_are_tiktokens() {
        use rand::{Rng, SeedableRng};
        let reference = [tiktoken_rs::cl100k_base().unwrap(), tiktoken_rs::o200k_base().unwrap()];
        let alphabet: Vec<&str> = vec![
            " ",
            "  ",
            "\n",
            "\r\n",
            "\t",
            "\u{a0}",
            "\u{3000}",
            "a",
            "Z",
            "word",
            "Words",
            "CamelCase",
            "é",
            "ß",
            "Ünï",
            "東京",
            "タワー",
            "𝔘",
            "\u{301}",
            "ı",
            "0",
            "42",
            "123456",
            "'",
            "'s",
            "'T",
            "'re",
            "'LL",
            ".",
            ",",
            "!?",
            "...",
            "-",
            "/",
            "—",
            "€",
            "😀",
            "#",
            "\\",
            "\"",
            "()",
            "_",
            "$1,000",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut texts: Vec<String> = (0..3000)
            .map(|_| (0..rng.random_range(0..40)).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect())
            .collect();
        texts.extend(
            [
                "[episodic] Caroline: I went to a LGBTQ support group yesterday and it was so powerful.\n",
                "[semantic] The user's flight LH1234 leaves on 2024-05-03 at 07:45 from gate B12.  \n\n",
                "trailing spaces   ",
                "   ",
                "\n\n\n",
                "",
            ]
            .map(String::from),
        );
        for (encoding, tiktoken) in [Encoding::Cl100kBase, Encoding::O200kBase].into_iter().zip(&reference) {
            let bpe = Bpe::new(encoding);
            for text in &texts {
                let expected = tiktoken.encode_ordinary(text);
                assert_eq!(bpe.0.encode(text.as_str()), expected, "{encoding:?} {text:?}");
                assert_eq!(bpe.count(text), expected.len(), "{encoding:?} {text:?}");
                let max = expected.len() / 2;
                let cut = bpe.truncate(text, max);
                assert!(text.starts_with(&cut) && bpe.count(&cut) <= max, "{encoding:?} {text:?} cut to {cut:?}");
            }
        }
    }
}
