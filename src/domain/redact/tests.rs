use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;

use super::*;

fn redactor() -> Redactor {
    Redactor::new(&RedactionRules::default()).expect("default rules compile")
}

fn redact(text: &str) -> String {
    redactor().redact(text).text
}

/// The findings as (kind name, matched text), in order.
fn found(text: &str) -> Vec<(String, String)> {
    redactor().find(text).into_iter().map(|f| (f.kind.name().to_owned(), text[f.start..f.end].to_owned())).collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected.iter().map(|(k, m)| ((*k).to_owned(), (*m).to_owned())).collect()
}

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

#[test]
fn every_dev_snippet_is_found_exactly() {
    let corpus = include_str!("../../../tests/fixtures/redaction/dev.jsonl");
    let redactor = redactor();
    let mut failures = Vec::new();
    let (mut positives, mut negatives) = (0, 0);
    for line in corpus.lines().filter(|line| !line.trim().is_empty()) {
        let snippet: Snippet = serde_json::from_str(line).expect("dev corpus line is valid JSON");
        if snippet.expect.is_empty() {
            negatives += 1;
        } else {
            positives += 1;
        }
        let mut got: Vec<(String, String)> = redactor
            .find(&snippet.text)
            .into_iter()
            .map(|f| (f.kind.name().to_owned(), snippet.text[f.start..f.end].to_owned()))
            .collect();
        let mut want: Vec<(String, String)> =
            snippet.expect.iter().map(|e| (e.kind.clone(), e.matched.clone())).collect();
        got.sort();
        want.sort();
        if got != want {
            failures.push(format!("{:?}\n  want {want:?}\n  got  {got:?}", snippet.text));
        }
    }
    assert!(positives >= 150 && negatives >= 150, "{positives} positive and {negatives} negative snippets");
    assert!(failures.is_empty(), "{} snippets differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn placeholders_name_the_kind() {
    let names: Vec<String> = Kind::BUILTIN.iter().map(Kind::placeholder).collect();
    assert_eq!(
        names,
        [
            "[email]",
            "[phone]",
            "[card]",
            "[iban]",
            "[national_id]",
            "[ip_address]",
            "[api_key]",
            "[jwt]",
            "[secret]",
            "[password]"
        ]
    );
    assert_eq!(Kind::Custom("employee_id".into()).placeholder(), "[employee_id]");
}

#[test]
fn kinds_serialise_as_their_names() {
    assert_eq!(serde_json::to_value(Kind::NationalId).unwrap(), json!("national_id"));
    assert_eq!(serde_json::to_value(Kind::Custom("badge".into())).unwrap(), json!("badge"));
    assert_eq!(serde_json::from_value::<Kind>(json!("ip_address")).unwrap(), Kind::IpAddress);
    assert_eq!(serde_json::from_value::<Kind>(json!("badge")).unwrap(), Kind::Custom("badge".into()));
}

#[test]
fn redaction_replaces_findings_and_keeps_the_rest_byte_for_byte() {
    let out = redactor().redact("Mail jane@example.com or call (555) 123-4567, thanks!");
    assert_eq!(out.text, "Mail [email] or call [phone], thanks!");
    assert_eq!(out.applied, BTreeMap::from([(Kind::Email, 1), (Kind::Phone, 1)]));
    let untouched = "Nothing to see here: v1.2.3, 2024-03-15, 3f2a9c1e8b7d6f5a4e3d2c1b0a9f8e7d6c5b4a39.";
    assert_eq!(redactor().redact(untouched).text, untouched);
    assert!(redactor().redact(untouched).applied.is_empty());
}

#[test]
fn redacting_twice_changes_nothing_more() {
    let once = redact("password=hunter2 card 4111 1111 1111 1111 key sk_live_51HqJx2KZvKYlo2C0aBcDeFgHiJ");
    assert_eq!(once, "password=[password] card [card] key [api_key]");
    assert_eq!(redact(&once), once);
}

#[test]
fn emails_are_found_but_not_package_versions_or_image_names() {
    assert_eq!(
        found("write to jane.doe+news@mail.example.co.uk."),
        pairs(&[("email", "jane.doe+news@mail.example.co.uk")])
    );
    assert_eq!(found("lodash@4.17.21, icon@2x.png, git@github.com:org/repo.git"), pairs(&[]));
    assert_eq!(found("ssh://deploy@host.example.com"), pairs(&[]));
}

#[test]
fn phones_are_found_in_national_and_international_forms() {
    for phone in
        ["(555) 123-4567", "555-123-4567", "+1 415 555 2671", "+44 (0)20 7946 0958", "030 12345678", "06 12 34 56 78"]
    {
        assert_eq!(found(&format!("phone {phone}")), pairs(&[("phone", phone)]), "{phone}");
    }
}

#[test]
fn dates_versions_times_and_ranges_are_not_phones() {
    for text in
        ["2024-03-15", "15.01.2023 14:30", "v10.0.19045", "12:30:45", "2019-2023", "order #123456789", "01.02.2023 14"]
    {
        assert_eq!(found(text), pairs(&[]), "{text}");
    }
}

#[test]
fn bare_ten_digit_numbers_are_phones_only_after_a_context_word() {
    assert_eq!(found("call 5551234567"), pairs(&[("phone", "5551234567")]));
    assert_eq!(found("invoice 5551234567"), pairs(&[]));
    assert_eq!(found("hotel 5551234567"), pairs(&[]));
}

#[test]
fn cards_need_a_valid_luhn_checksum_and_usual_grouping() {
    assert_eq!(found("4111 1111 1111 1111"), pairs(&[("card", "4111 1111 1111 1111")]));
    assert_eq!(found("4111 1111 1111 1112"), pairs(&[]));
    assert_eq!(found("41 1111 1111 1111 11"), pairs(&[]));
    assert_eq!(found("3782-822463-10005"), pairs(&[("card", "3782-822463-10005")]));
    // A millisecond timestamp that happens to pass Luhn is not a card.
    assert!(luhn::valid("1700000000004"));
    assert_eq!(found("at 1700000000004"), pairs(&[]));
    // A card inside a longer run of grouped digits is still found.
    assert_eq!(found("ref 12 4111 1111 1111 1111"), pairs(&[("card", "4111 1111 1111 1111")]));
}

#[test]
fn ibans_are_checked_by_checksum_and_country_format() {
    assert_eq!(found("DE89 3704 0044 0532 0130 00"), pairs(&[("iban", "DE89 3704 0044 0532 0130 00")]));
    assert_eq!(found("DE89370400440532013000"), pairs(&[("iban", "DE89370400440532013000")]));
    assert_eq!(found("DE88 3704 0044 0532 0130 00"), pairs(&[]));
    assert_eq!(found("BE68 5390 0754 7034 CASH"), pairs(&[("iban", "BE68 5390 0754 7034")]));
}

#[test]
fn ssns_exclude_the_invalid_ranges() {
    assert_eq!(found("SSN 536-22-1234"), pairs(&[("national_id", "536-22-1234")]));
    for invalid in ["000-12-3456", "666-12-3456", "912-12-3456", "536-00-1234", "536-22-0000"] {
        assert_eq!(found(&format!("SSN {invalid}")), pairs(&[]), "{invalid}");
    }
    assert_eq!(found("ssn: 536221234"), pairs(&[("national_id", "536221234")]));
    assert_eq!(found("ticket 536221234"), pairs(&[]));
}

#[test]
fn ip_addresses_are_found_but_not_versions_loopback_or_networks() {
    assert_eq!(found("from 203.0.113.45 port 22"), pairs(&[("ip_address", "203.0.113.45")]));
    assert_eq!(found("peer 2001:db8::8a2e:370:7334"), pairs(&[("ip_address", "2001:db8::8a2e:370:7334")]));
    for text in [
        "v1.2.3.4",
        "version 4.0.1.2",
        "1.2.3",
        "127.0.0.1",
        "::1",
        "10.0.0.0/8",
        "1.3.6.1.2.1",
        "std::fmt",
        "12:30:45",
    ] {
        assert_eq!(found(text), pairs(&[]), "{text}");
    }
}

#[test]
fn api_keys_are_found_by_prefix() {
    for key in [
        "sk-proj-4fJ8kL2mN9pQ7rS3tU6vW1xY5zA0bC8dE2fG",
        "sk_live_51HqJx2KZvKYlo2C0aBcDeFgHiJ",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "xoxb-2194573810-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "AKIAIOSFODNN7EXAMPLE",
        "AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI",
        "glpat-xY7zK2mP9qR4sT1vW3uB",
    ] {
        assert_eq!(found(&format!("key {key} here")), pairs(&[("api_key", key)]), "{key}");
    }
    assert_eq!(found("sk-learn-compatible-estimators-and-pipelines"), pairs(&[]));
}

#[test]
fn a_jwt_is_reported_once_as_a_jwt() {
    let jwt =
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
    assert_eq!(found(&format!("token={jwt}")), pairs(&[("jwt", jwt)]));
    assert_eq!(found(&format!("Authorization: Bearer {jwt}")), pairs(&[("jwt", jwt)]));
}

#[test]
fn high_entropy_strings_are_secrets_but_hashes_uuids_and_identifiers_are_not() {
    assert_eq!(found("code 7GhT2kLp9QzX4mNw8RvB3sYc ok"), pairs(&[("secret", "7GhT2kLp9QzX4mNw8RvB3sYc")]));
    for text in [
        "fixed in commit 3f2a9c1e8b7d6f5a4e3d2c1b0a9f8e7d6c5b4a39",
        "id 550e8400-e29b-41d4-a716-446655440000",
        "call parseUserConfigurationFromEnvironment2",
        "SGVsbG8gd29ybGQsIHRoaXMgaXMgYSB0ZXN0IG9mIGJhc2U2NA==",
    ] {
        assert_eq!(found(text), pairs(&[]), "{text}");
    }
}

/// Random base62 tokens of 24 to 40 characters stand for secrets nobody
/// wrote by hand; the entropy rule must find nearly all of them.
#[test]
fn random_tokens_are_found_as_secrets() {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let redactor = redactor();
    let (mut tokens, mut caught) = (0, 0);
    for i in 0..1000 {
        let len = 24 + i % 17;
        let token: String = (0..len).map(|_| ALPHABET[(next() % 62) as usize] as char).collect();
        // A token without a digit or without both cases is outside the rule.
        let classes = token.bytes().any(|b| b.is_ascii_digit())
            && token.bytes().any(|b| b.is_ascii_uppercase())
            && token.bytes().any(|b| b.is_ascii_lowercase());
        if !classes {
            continue;
        }
        tokens += 1;
        let text = format!("the code is {token} for now");
        let findings = redactor.find(&text);
        if findings.iter().any(|f| text[f.start..f.end] == token) {
            caught += 1;
        }
    }
    assert!(caught * 100 >= tokens * 95, "{caught} of {tokens} random tokens found");
}

#[test]
fn passwords_keep_their_key_and_lose_their_value() {
    assert_eq!(redact("password=hunter2"), "password=[password]");
    assert_eq!(redact("DB_PASSWORD: \"S3cr3t!\""), "DB_PASSWORD: \"[password]\"");
    assert_eq!(redact("the wifi password is Tr0ub4dor&3."), "the wifi password is [password].");
    assert_eq!(redact("mysql --password Pa55w0rd"), "mysql --password [password]");
    assert_eq!(redact("postgres://app:s3cret@db:5432/x"), "postgres://app:[password]@db:5432/x");
    for text in [
        "password: String,",
        "token = self.token",
        "password = getpass()",
        "PASSWORD=${DB_PASSWORD}",
        "the password is incorrect",
        "max_tokens=512",
    ] {
        assert_eq!(found(text), pairs(&[]), "{text}");
    }
}

#[test]
fn each_kind_can_be_switched_off() {
    let text = "jane@example.com (555) 123-4567 4111111111111111 DE89370400440532013000 123-45-6789 \
                203.0.113.45 ghp_16C7e42F292c6912E7710c838347Ae178B4a \
                eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlX2hlcmU 7GhT2kLp9QzX4mNw8RvB3sYc password=hunter2";
    let all = redactor().redact(text);
    assert_eq!(all.applied.keys().cloned().collect::<Vec<_>>(), Kind::BUILTIN.to_vec());
    for kind in Kind::BUILTIN {
        let mut rules = RedactionRules::default();
        rules.set(&kind, false);
        assert!(!rules.enabled(&kind));
        let out = Redactor::new(&rules).unwrap().redact(text);
        assert!(!out.applied.contains_key(&kind), "{kind:?} still applied");
        assert_eq!(out.applied.len(), Kind::BUILTIN.len() - 1, "{kind:?}: {:?}", out.applied);
    }
}

#[test]
fn rules_deserialise_with_defaults_and_reject_unknown_fields() {
    let rules: RedactionRules = serde_json::from_value(json!({"phone": false})).unwrap();
    assert!(!rules.phone && rules.email && rules.extra.is_empty());
    assert_eq!(serde_json::from_value::<RedactionRules>(json!({})).unwrap(), RedactionRules::default());
    assert!(serde_json::from_value::<RedactionRules>(json!({"phnoe": false})).is_err());
}

#[test]
fn extra_patterns_are_redacted_under_their_own_name() {
    let rules = RedactionRules {
        extra: vec![
            ExtraPattern { name: "employee_id".into(), pattern: r"\bEMP-\d{6}\b".into() },
            ExtraPattern { name: "badge".into(), pattern: r"badge (?P<value>\d{4})".into() },
        ],
        ..RedactionRules::default()
    };
    let out = Redactor::new(&rules).unwrap().redact("EMP-123456 has badge 4821 and mail a@b.io");
    assert_eq!(out.text, "[employee_id] has badge [badge] and mail [email]");
    assert_eq!(out.applied[&Kind::Custom("badge".into())], 1);
}

#[test]
fn bad_extra_patterns_are_rejected_with_their_name() {
    let with = |name: &str, pattern: &str| RedactionRules {
        extra: vec![ExtraPattern { name: name.into(), pattern: pattern.into() }],
        ..RedactionRules::default()
    };
    let err = Redactor::new(&with("ticket", "TICKET-(\\d+")).unwrap_err();
    assert!(err.starts_with("extra pattern \"ticket\" is not a valid regular expression"), "{err}");
    assert_eq!(Redactor::new(&with("maybe", "x*")).unwrap_err(), "extra pattern \"maybe\" matches the empty string");
    assert!(Redactor::new(&with("email", "x")).unwrap_err().contains("built-in"));
    assert!(Redactor::new(&with("Bad Name", "x")).unwrap_err().contains("\"Bad Name\""));
    let mut twice = with("a", "x");
    twice.extra.push(ExtraPattern { name: "a".into(), pattern: "y".into() });
    assert!(Redactor::new(&twice).unwrap_err().contains("used twice"));
}

#[test]
fn a_broad_extra_pattern_cannot_cut_an_email_in_half() {
    let rules = RedactionRules {
        extra: vec![ExtraPattern { name: "number".into(), pattern: r"\d{6}".into() }],
        ..RedactionRules::default()
    };
    let out = Redactor::new(&rules).unwrap().redact("john123456@example.com and 654321");
    assert_eq!(out.text, "[email] and [number]");
}

#[test]
fn overlaps_keep_the_most_specific_kind() {
    // The e-mail's domain is an IP literal; the URL's password is not an e-mail.
    assert_eq!(found("user@192.168.1.20.example.com"), pairs(&[("email", "user@192.168.1.20.example.com")]));
    assert_eq!(
        found("api_key=sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
        pairs(&[("api_key", "sk_test_4eC39HqLyjWDarjtT1zdp7dc")])
    );
    assert_eq!(found("::ffff:192.0.2.128"), pairs(&[("ip_address", "::ffff:192.0.2.128")]));
}

#[test]
fn non_ascii_text_is_sliced_only_at_match_boundaries() {
    let text = "Grüße an Zoë — 電話 +81 90 1234 5678, メール taro@example.jp 🙂 IBAN DE89370400440532013000 ✓";
    assert_eq!(redact(text), "Grüße an Zoë — 電話 [phone], メール [email] 🙂 IBAN [iban] ✓");
    // Multi-byte characters right before and after every kind of candidate.
    for text in [
        "é4111111111111111é",
        "ü192.168.1.1ü",
        "日password=ü",
        "€555-123-4567€",
        "ßsk-ааааааааааааааааааааааа",
        "密码: 密码",
        "🙂::1🙂",
    ] {
        let _ = redact(text);
    }
}

#[test]
fn json_string_leaves_are_redacted_and_keys_kept() {
    let mut value = json!({
        "email": "jane@example.com",
        "notes": ["call 555-123-4567", 42, null, {"password": "hunter2", "ok": true}],
    });
    let applied = redactor().redact_json(&mut value);
    assert_eq!(
        value,
        json!({
            "email": "[email]",
            "notes": ["call [phone]", 42, null, {"password": "[password]", "ok": true}],
        })
    );
    assert_eq!(applied, BTreeMap::from([(Kind::Email, 1), (Kind::Phone, 1), (Kind::Password, 1)]));
    // A credential field holding a recognised key keeps the specific kind.
    let mut value = json!({"api_key": "ghp_16C7e42F292c6912E7710c838347Ae178B4a", "token": null});
    redactor().redact_json(&mut value);
    assert_eq!(value, json!({"api_key": "[api_key]", "token": null}));
}

#[test]
fn extensions_may_follow_a_phone_number_without_a_space() {
    assert_eq!(found("call 623.767.2854x56500"), pairs(&[("phone", "623.767.2854x56500")]));
    assert_eq!(found("call (296)813-0832x12295"), pairs(&[("phone", "(296)813-0832x12295")]));
    assert_eq!(found("bel (015)-8313467"), pairs(&[("phone", "(015)-8313467")]));
}

#[test]
fn maestro_cards_may_have_twelve_digits_and_product_codes_are_not_cards() {
    assert!(luhn::valid("676375936249"));
    assert_eq!(found("card 676375936249"), pairs(&[("card", "676375936249")]));
    // Twelve Luhn-valid digits without a Maestro prefix are a card only
    // after a card word, which vouches for any prefix.
    assert!(luhn::valid("412345678905"));
    assert_eq!(found("Shipment 412345678905 left today"), pairs(&[]));
    assert_eq!(found("card 412345678905"), pairs(&[("card", "412345678905")]));
    assert!(luhn::valid("060467098152"));
    assert_eq!(found("Refund to 060467098152 please"), pairs(&[("card", "060467098152")]));
    assert_eq!(found("Batch 060467098152 is ready"), pairs(&[]));
    assert!(luhn::valid("3338040525397"));
    assert_eq!(found("EAN 3338040525397"), pairs(&[]));
}

#[test]
fn an_iban_wins_over_a_card_number_inside_it() {
    assert_eq!(found("IBAN ES07 3565 3882 2863 9241 1655."), pairs(&[("iban", "ES07 3565 3882 2863 9241 1655")]));
}

#[test]
fn vendor_prefixed_keys_need_no_digit() {
    assert_eq!(
        found("Found glpat-SigvyeROnphcwvRErpWG in the logs"),
        pairs(&[("api_key", "glpat-SigvyeROnphcwvRErpWG")])
    );
}

#[test]
fn generated_passwords_keep_their_symbols() {
    for (text, value) in [
        ("mysql --password=&3RdLwLwZmRb", "&3RdLwLwZmRb"),
        ("pwd: E*)W(0yVGA0Ydc", "E*)W(0yVGA0Ydc"),
        ("DB_PASSWORD=$5qqIHEawLT7R!", "$5qqIHEawLT7R!"),
        ("pwd: jqp^2Lo1%y9H(", "jqp^2Lo1%y9H("),
        ("The wifi password is &R31eTef", "&R31eTef"),
    ] {
        assert_eq!(found(text), pairs(&[("password", value)]), "{text}");
    }
    assert_eq!(found("GET /cb?token=Zx9Yw8Vu7T&state=abc HTTP/1.1"), pairs(&[("password", "Zx9Yw8Vu7T")]));
    assert_eq!(found("fn f(password: &str)"), pairs(&[]));
}

#[test]
fn a_browser_revision_is_not_an_ip_address() {
    assert_eq!(found("Mozilla/5.0 (X11; Linux x86_64; rv:1.9.7.20) Gecko/20100101"), pairs(&[]));
}

#[test]
fn local_numbers_need_a_phone_word_and_trunk_numbers_run_together_do_not() {
    assert_eq!(found("Emergency contact 8747-4955 (Judy)"), pairs(&[("phone", "8747-4955")]));
    assert_eq!(found("Tel. 3783.2567"), pairs(&[("phone", "3783.2567")]));
    assert_eq!(found("worked there from 1990-2015"), pairs(&[]));
    assert_eq!(found("Sofia Rossi: 0122371731"), pairs(&[("phone", "0122371731")]));
    assert_eq!(found("Order 0122371731 shipped"), pairs(&[]));
    assert_eq!(found("Left a voicemail at (0011) 998469."), pairs(&[("phone", "(0011) 998469")]));
    assert_eq!(found("Emergency contact +61.8.4625.2954"), pairs(&[("phone", "+61.8.4625.2954")]));
    assert_eq!(found("drift +20.5 15.3 12.1"), pairs(&[]));
    assert_eq!(found("Call me at 1-190-558-6534"), pairs(&[("phone", "1-190-558-6534")]));
    assert_eq!(found("reach her on 176-282-2653 x641 today"), pairs(&[("phone", "176-282-2653 x641")]));
    assert_eq!(found("Order GP-00367-251 is delayed"), pairs(&[]));
    // A bracketed trunk zero is the phone's, not the start of an SSN that a
    // field name nearby would vouch for.
    assert_eq!(
        found("{\"ssn\": \"483-63-1356\"} | Tel. +31(0)189 486354"),
        pairs(&[("national_id", "483-63-1356"), ("phone", "+31(0)189 486354")])
    );
}

#[test]
fn a_closing_bracket_ends_a_password_only_when_one_was_opened_before_it() {
    assert_eq!(found("(pwd: abc123x)"), pairs(&[("password", "abc123x")]));
    assert_eq!(found("pwd: a$cy7Sz)"), pairs(&[("password", "a$cy7Sz)")]));
}

#[test]
fn a_phone_word_before_digits_that_another_word_names_does_not_make_them_a_phone() {
    for text in [
        "Call me about order 2345 6789 tomorrow.",
        "Text me the code 123 4567 when it arrives.",
        "The new phone costs 1 299 000 won.",
        "Call on 2024-05-01 at 10:30.",
        "Phone support: ticket 4455 6677 is still open.",
        "The phone runs version 14 2 1 0 33.",
        "call at 15.01.2024 09 30",
    ] {
        assert_eq!(found(text), pairs(&[]), "{text}");
    }
    assert_eq!(found("Order questions: call 2345 6789."), pairs(&[("phone", "2345 6789")]));
    assert_eq!(found("Phone no. 2 345 678"), pairs(&[("phone", "2 345 678")]));
}
