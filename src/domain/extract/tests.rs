use super::*;

const LABELLED: &str = include_str!("../../../tests/fixtures/extract/labelled.jsonl");

/// The facts of `text` as (predicate, object) pairs, for short asserts.
fn pairs(text: &str) -> Vec<(&'static str, String)> {
    facts_in(text).into_iter().map(|f| (f.predicate, f.object)).collect()
}

fn one(predicate: &'static str, object: &str) -> Vec<(&'static str, String)> {
    vec![(predicate, object.to_string())]
}

#[test]
fn name_is_read_from_my_name_is_and_call_me() {
    assert_eq!(pairs("My name is Sarah."), one("name", "Sarah"));
    assert_eq!(pairs("Hi there, my name's Tom Baker and I'm new here."), one("name", "Tom Baker"));
    assert_eq!(pairs("Call me Ishmael."), one("name", "Ishmael"));
    assert_eq!(pairs("Hi, I'm Daniel!"), one("name", "Daniel"));
    assert_eq!(facts_in("My name is Sarah.")[0].confidence, 0.9);
}

#[test]
fn works_as_needs_a_job_noun() {
    assert_eq!(pairs("I'm a software engineer."), one("works_as", "software engineer"));
    assert_eq!(pairs("I work as a nurse."), one("works_as", "nurse"));
    assert!(pairs("I'm a bit tired today.").is_empty());
    assert!(pairs("I'm a big eater.").is_empty());
    assert!(pairs("I'm a retired firefighter.").is_empty());
    assert!(pairs("I'm a terrible cook.").is_empty());
}

#[test]
fn works_at_follows_work_at_or_a_job() {
    assert_eq!(pairs("I work at Google."), one("works_at", "Google"));
    assert_eq!(pairs("I've been working at Target for three years."), one("works_at", "Target"));
    assert_eq!(
        pairs("I'm an accountant at Deloitte."),
        vec![("works_as", "accountant".to_string()), ("works_at", "Deloitte".to_string())]
    );
    assert!(pairs("I work from home.").is_empty());
    assert!(pairs("I work for myself.").is_empty());
}

#[test]
fn lives_in_and_from_keep_a_region() {
    assert_eq!(pairs("I live in Portland, Oregon."), one("lives_in", "Portland, Oregon"));
    assert_eq!(pairs("We just moved to Denver last month!"), one("lives_in", "Denver"));
    assert_eq!(pairs("I moved to Berlin in 2019."), one("lives_in", "Berlin"));
    assert_eq!(pairs("I'm from Italy originally."), one("from", "Italy"));
    assert_eq!(pairs("I grew up in Manila."), one("from", "Manila"));
}

#[test]
fn has_pet_keeps_the_animal_phrase_and_a_name() {
    assert_eq!(pairs("I just adopted a puppy named Max last week."), one("has_pet", "puppy named Max"));
    assert_eq!(pairs("My cat Luna knocked over my coffee."), one("has_pet", "cat Luna"));
    assert_eq!(pairs("I walk my golden retriever every morning."), one("has_pet", "golden retriever"));
    assert_eq!(
        pairs("I have two cats and a hamster."),
        vec![("has_pet", "two cats".to_string()), ("has_pet", "hamster".to_string())]
    );
    assert!(pairs("I bought dog food.").is_empty());
    assert!(pairs("My neighbour has a huge German shepherd.").is_empty());
}

#[test]
fn allergic_to_splits_a_list() {
    assert_eq!(
        pairs("I'm allergic to penicillin and latex."),
        vec![("allergic_to", "penicillin".to_string()), ("allergic_to", "latex".to_string())]
    );
    assert_eq!(pairs("I have a peanut allergy."), one("allergic_to", "peanut"));
}

#[test]
fn has_child_is_the_name_when_given_else_the_relation() {
    assert_eq!(pairs("My son Jake just started kindergarten."), one("has_child", "Jake"));
    assert_eq!(pairs("My daughter, Emma, paints."), one("has_child", "Emma"));
    assert_eq!(pairs("I have two kids."), one("has_child", "two kids"));
    assert_eq!(pairs("My son is a doctor."), one("has_child", "son"));
}

#[test]
fn partners_are_married_to_or_has_partner() {
    assert_eq!(pairs("My wife Anna is a chef."), one("married_to", "Anna"));
    assert_eq!(pairs("I'm married to a wonderful man named Steve."), one("married_to", "Steve"));
    assert_eq!(pairs("My boyfriend Luis cooked."), one("has_partner", "Luis"));
    assert!(pairs("My ex-husband lives in Texas.").is_empty());
}

#[test]
fn likes_dislikes_and_prefers() {
    assert_eq!(
        pairs("I like jazz and classical music."),
        vec![("likes", "jazz".to_string()), ("likes", "classical music".to_string())]
    );
    assert_eq!(pairs("I'm a big fan of jazz."), one("likes", "jazz"));
    assert_eq!(pairs("My favourite band is Radiohead."), one("likes", "Radiohead"));
    assert_eq!(pairs("I can't stand loud music when I'm working."), one("dislikes", "loud music"));
    assert_eq!(pairs("I don't like horror movies."), one("dislikes", "horror movies"));
    assert_eq!(pairs("I prefer tea over coffee."), one("prefers", "tea"));
    assert!(pairs("I love it!").is_empty());
}

#[test]
fn questions_yield_nothing() {
    assert!(pairs("Do you have a dog?").is_empty());
    assert!(pairs("Am I allergic to shellfish?").is_empty());
    assert!(pairs("Who doesn't love pizza?").is_empty());
}

#[test]
fn negations_yield_nothing() {
    assert!(pairs("I'm not allergic to anything.").is_empty());
    assert!(pairs("I don't have any pets.").is_empty());
    assert!(pairs("I don't live in the city anymore.").is_empty());
    assert!(pairs("I don't hate it, honestly.").is_empty());
}

#[test]
fn someone_elses_facts_are_not_the_speakers() {
    assert!(pairs("My friend is a nurse.").is_empty());
    assert!(pairs("My sister works as a lawyer in Boston.").is_empty());
    assert!(pairs("She lives in Rome and works at Fiat.").is_empty());
}

#[test]
fn hypotheticals_and_past_states_yield_nothing() {
    assert!(pairs("I wish I lived in Paris.").is_empty());
    assert!(pairs("If I had a cat, I'd name it Luna.").is_empty());
    assert!(pairs("I'd love to get a parrot someday.").is_empty());
    assert!(pairs("I used to live in Tokyo.").is_empty());
}

#[test]
fn quoted_speech_and_marked_sarcasm_yield_nothing() {
    assert!(pairs("He said \"I'm a doctor\" but I doubt it.").is_empty());
    assert!(pairs("She told me, \"I live in Miami now.\"").is_empty());
    assert!(pairs("Oh great, I just love being stuck in traffic.").is_empty());
}

#[test]
fn objects_are_substrings_and_predicates_are_listed_over_the_labelled_file() {
    let mut lines = 0;
    for line in LABELLED.lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
        let text = row["text"].as_str().expect("text is a string");
        for f in facts_in(text) {
            assert!(text.contains(&f.object), "{:?} is not in {text:?}", f.object);
            assert!(PREDICATES.contains(&f.predicate), "{} is not listed", f.predicate);
            assert!(f.object.split_whitespace().count() <= MAX_OBJECT_WORDS);
            assert!((0.0..=1.0).contains(&f.confidence));
        }
        for label in row["facts"].as_array().expect("facts is a list") {
            let predicate = label["predicate"].as_str().expect("predicate is a string");
            assert!(PREDICATES.contains(&predicate), "label {predicate} is not listed");
            assert!(text.contains(label["object"].as_str().expect("object is a string")));
        }
        lines += 1;
    }
    assert!(lines >= 250);
}

#[test]
fn sentences_keep_abbreviations_decimals_and_closing_quotes() {
    assert_eq!(
        sentences("Dr. Smith said e.g. 3.5 mg. Then I left!! OK? \"Yes.\" Next\nline"),
        vec!["Dr. Smith said e.g. 3.5 mg.", "Then I left!!", "OK?", "\"Yes.\"", "Next", "line"]
    );
    assert!(sentences("  \n ").is_empty());
}

#[test]
fn summarise_never_invents_text_and_keeps_order() {
    let texts = [
        "Started the migration. It was slow. We decided to use Postgres instead of MySQL.",
        "ok",
        "The deploy failed because the config file was missing. Then we had lunch.",
        "I'm allergic to peanuts, remember that. Nice weather today.",
    ];
    let summary = summarise(&texts, 3);
    assert_eq!(
        summary,
        "We decided to use Postgres instead of MySQL. The deploy failed because the config file was missing. \
         I'm allergic to peanuts, remember that."
    );
    let all: Vec<&str> = texts.iter().flat_map(|t| sentences(t)).collect();
    for s in sentences(&summary) {
        assert!(all.contains(&s), "{s:?} was invented");
    }
}

#[test]
fn summarise_drops_repeats_and_honours_the_limit() {
    let texts = ["The build failed with a linker error.", "The build failed with a linker error again."];
    assert_eq!(summarise(&texts, 5), "The build failed with a linker error again.");
    assert_eq!(summarise(&texts, 0), "");
    assert_eq!(summarise(&[], 3), "");
}
