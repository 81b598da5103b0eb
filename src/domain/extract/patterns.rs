//! The patterns of the fact reader: word lists, boundaries and the rules
//! that find each predicate's object.

use std::sync::LazyLock;

use regex::Regex;

/// Objects longer than this are more likely a whole clause than a thing, so
/// the fact is dropped rather than stored half-right.
pub(super) const MAX_OBJECT_WORDS: usize = 6;

/// Compiles a pattern in which a plain apostrophe also matches the curly one
/// that phones and word processors type. Character classes spell the
/// apostrophe as `\x27` so that they are left alone.
pub(super) fn re(pattern: &str) -> Regex {
    Regex::new(&pattern.replace('\'', "['’]")).expect("extraction patterns are valid")
}

/// Adverbs allowed between "I" and the verb: they do not change the meaning
/// ("I really love"). "not", "never", "don't" are deliberately absent, which
/// is how negated statements fall through.
pub(super) const ADVERBS: &str = r"(?:\s+(?:really|also|just|actually|honestly|absolutely|totally|definitely|currently|now|still|truly|genuinely|personally|mostly|usually|generally|do|kind\s+of|sort\s+of|so|seriously|literally|recently))*";

/// A capitalised name of one to three words.
pub(super) const NAME: &str = r"\p{Lu}[\p{L}\x27’-]*(?:\s+\p{Lu}[\p{L}\x27’-]*){0,2}";

/// A capitalised one-word name, used after a relation ("my son Jake").
pub(super) const NAME1: &str = r"\p{Lu}[\p{L}\x27’-]*";

/// Nouns of occupation. A curated list rather than a suffix rule: "-er" and
/// "-ist" also make "big eater", "perfectionist" and "morning person" type
/// phrases that describe a person, not a job.
pub(super) const JOBS: &str = "accountant|actor|actress|actuary|administrator|adviser|advisor|analyst|animator|anthropologist|\
archaeologist|architect|artist|assistant|attorney|auditor|author|baker|banker|barber|barista|barrister|bartender|\
biologist|bookkeeper|broker|builder|butcher|caregiver|carer|carpenter|cashier|ceo|cfo|chef|chemist|cleaner|clerk|coach|\
composer|consultant|contractor|cook|coordinator|cop|copywriter|counselor|counsellor|courier|cto|dancer|dentist|designer|\
detective|dev|developer|dietitian|diplomat|director|doctor|driver|economist|editor|electrician|emt|engineer|\
entrepreneur|executive|farmer|filmmaker|firefighter|florist|founder|co-founder|cofounder|freelancer|gardener|geologist|\
hairdresser|hairstylist|historian|housekeeper|hygienist|illustrator|influencer|instructor|interpreter|intern|janitor|\
journalist|judge|lawyer|lecturer|librarian|lifeguard|linguist|manager|marketer|mathematician|mechanic|midwife|\
musician|nanny|novelist|nurse|nutritionist|officer|optician|optometrist|painter|paralegal|paramedic|pastor|\
pharmacist|photographer|physician|physicist|physiotherapist|pilot|planner|plumber|poet|politician|postdoc|\
practitioner|priest|principal|producer|professor|programmer|psychiatrist|psychologist|rabbi|realtor|receptionist|\
recruiter|reporter|representative|researcher|salesman|salesperson|saleswoman|scientist|secretary|server|singer|\
soldier|solicitor|songwriter|statistician|student|stylist|supervisor|surgeon|sysadmin|tailor|teacher|technician|\
therapist|trader|trainer|translator|tutor|veterinarian|vet|waiter|waitress|welder|writer|youtuber";

/// Words before a job noun that mean the person does not (or not yet, or
/// not for pay) do the job, or that judge skill rather than name a job
/// ("a terrible cook").
pub(super) const NOT_A_JOB: &[&str] = &[
    "retired",
    "former",
    "ex",
    "aspiring",
    "wannabe",
    "future",
    "would-be",
    "good",
    "great",
    "bad",
    "terrible",
    "decent",
    "horrible",
    "awful",
    "lousy",
    "better",
    "worse",
    "excellent",
    "amazing",
    "huge",
    "big",
    "little",
    "natural",
    "fast",
    "slow",
    "careful",
    "picky",
    "messy",
    "amateur",
    "hobby",
    "weekend",
    "backseat",
    "armchair",
];

/// Animals kept as pets, with common breeds, so that "my golden retriever"
/// is a pet without the word "dog".
pub(super) const ANIMALS: &str = "dogs?|pupp(?:y|ies)|pups?|cats?|kittens?|kitty|kitties|hamsters?|rabbits?|bunn(?:y|ies)|\
guinea\\s+pigs?|parrots?|birds?|budgies?|canar(?:y|ies)|cockatiels?|parakeets?|goldfish|fish|turtles?|tortoises?|\
snakes?|lizards?|geckos?|iguanas?|horses?|pon(?:y|ies)|ferrets?|chinchillas?|gerbils?|rats?|mice|hedgehogs?|\
goats?|chickens?|hens|ducks?|axolotls?|retrievers?|labradors?|labs|poodles?|beagles?|terriers?|bulldogs?|\
shepherds?|husk(?:y|ies)|corgis?|dachshunds?|chihuahuas?|pugs?|collies?|spaniels?|greyhounds?|rottweilers?|\
labradoodles?|goldendoodles?|doodles?|schnauzers?|pomeranians?|sheepdogs?|tabby|tabbies|maine\\s+coons?";

/// Nouns after an animal word that make it part of another thing ("my dog
/// food", "my cat allergy").
pub(super) const NOT_A_PET_AFTER: &[&str] = &[
    "food",
    "breed",
    "bowl",
    "hair",
    "sitter",
    "walker",
    "park",
    "toy",
    "toys",
    "bed",
    "treats",
    "allergy",
    "allergies",
    "lover",
    "lovers",
    "person",
    "people",
    "video",
    "videos",
    "show",
    "tree",
    "shelter",
    "cafe",
];

/// Words that cannot start or sit inside a modifier run before a pet or a
/// job noun: they show the phrase is a clause, not a noun phrase.
pub(super) const STOP: &[&str] = &[
    "a",
    "an",
    "the",
    "and",
    "or",
    "of",
    "to",
    "in",
    "at",
    "on",
    "for",
    "with",
    "have",
    "has",
    "had",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "got",
    "get",
    "my",
    "our",
    "your",
    "his",
    "her",
    "their",
    "lot",
    "bit",
    "kind",
    "sort",
    "i",
    "you",
    "he",
    "she",
    "we",
    "they",
    "it",
    "that",
    "this",
    "not",
    "no",
    "friend's",
    "friend’s",
];

/// Objects that point at something instead of naming it ("I love it").
pub(super) const DEICTIC: &[&str] = &[
    "it",
    "that",
    "this",
    "these",
    "those",
    "you",
    "him",
    "her",
    "them",
    "us",
    "me",
    "myself",
    "yourself",
    "one",
    "everything",
    "anything",
    "nothing",
    "something",
    "someone",
    "anyone",
    "everyone",
    "all",
    "what",
    "how",
    "when",
    "your",
    "his",
    "their",
    "its",
    "not",
    "to",
    "being",
    "so",
    "such",
    "there",
    "here",
    "doing",
    "having",
    "about",
    "almost",
    "nearly",
    "over",
    "around",
    "years",
    "months",
    "weeks",
    "days",
    "ages",
    "free",
    "home",
];

/// Words and phrases that end an object wherever they follow it: a
/// conjunction or relative pronoun (a new clause starts), a time, frequency
/// or degree phrase, or "for"/"with" (purpose and company are not part of
/// the thing liked or the place lived in).
pub(super) const CUT_WORDS: &str = concat!(
    r"\s+(?:but|because|cause|'cause|so|since|when|whenever|while|which|who|whom|whose|that|where|though|although",
    r"|as|if|unless|until|till|before|after|than|then|whereas|plus|except|especially|particularly|like|lol|haha",
    r"|now|today|tonight|yesterday|tomorrow|anymore|currently|lately|recently|again|already|still|too|also",
    r"|either|originally|really|actually|ever|every|each|last|next|ago|for|with",
    r"|these\s+days|this\s+(?:week|weekend|month|year|morning|afternoon|evening|summer|winter|spring|fall|autumn)",
    r"|on\s+(?:the\s+)?weekends?|on\s+\w+days|in\s+the\s+(?:morning|evening|afternoon)s?|in\s+(?:mornings|evenings)",
    r"|at\s+the\s+moment|right\s+now|so\s+much|a\s+lot|very\s+much|more\s+than|most\s+days|most\s+of\s+the\s+time",
    r"|all\s+the\s+time|in\s+\d+",
    r"|(?:a|one|two|three|four|five|six|seven|eight|nine|ten|a\s+few|several|\d+)\s+(?:years?|months?|weeks?|days?)",
    r")\b",
);

/// Punctuation that ends any object, and a dash between spaces.
pub(super) const CUT_PUNCTUATION: &str = r#"\s*[.;:!?()"“”…\[\]]|\s+[-–—]+(?:\s|$)"#;

/// Where an object ends: [`CUT_PUNCTUATION`], [`CUT_WORDS`], a comma, "and"
/// or "or".
pub(super) static CUT: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"(?i){CUT_PUNCTUATION}|\s*,|\s+(?:and|or)\b|{CUT_WORDS}")));

/// Like [`CUT`], but commas and "and"/"or" stay inside the object so that a
/// list ("jazz, blues and rock") can be split into items afterwards. A comma
/// or "and" followed by a new subject still ends it.
pub(super) static CUT_LIST: LazyLock<Regex> = LazyLock::new(|| {
    let new_subject = concat!(
        r"(?:\s*,\s*|\s+)(?:and\s+|but\s+|so\s+|or\s+)?",
        r"(?:I|I'm|I've|I'd|we|he|she|they|it|it's|you|my|our|his|her|their|that|this|which|who|though",
        r"|especially|particularly|but|so|because|since|when|while|like|lol|haha)\b",
    );
    re(&format!(r"(?i){CUT_PUNCTUATION}|{new_subject}|{CUT_WORDS}"))
});

/// Splits a list object into items.
pub(super) static LIST_SEP: LazyLock<Regex> =
    LazyLock::new(|| re(r"\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+|\s*&\s*"));

/// What "prefer" is compared against ends the preferred thing.
pub(super) static CUT_PREFER: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)\s+(?:over|to|rather\s+than|instead\s+of|than)\b"));

/// Markers of a clause that is wished, supposed or planned rather than
/// stated, looked for before the match in the same sentence.
pub(super) static HYPOTHETICAL: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i)\b(?:if|wish|wished|hope|hoping|imagine|suppose|pretend|dream|dreaming|would|wouldn't|could|couldn't|might|maybe|perhaps|someday|unless|whether|I'd|I'll|going\s+to|gonna|want\s+to|wanted\s+to|wanna|plan\s+to|planning\s+to|thinking\s+about|not\s+sure|don't\s+think|doubt|used\s+to|never)\b",
    )
});

/// A few markers that the speaker means the opposite of what they say.
pub(super) static SARCASM: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i)^\W*(?:oh|ah)\s+(?:great|joy|wonderful|fantastic|perfect|yay|sure)\b|\byeah,?\s+right\b|(?:^|\s)/s\b|\bjust\s+what\s+I\s+needed\b",
    )
});

/// A chat transcript's "Name: " speaker tag at the start of a sentence.
pub(super) static SPEAKER: LazyLock<Regex> = LazyLock::new(|| re(r"^\p{Lu}[\p{L}\d_.-]{0,30}:\s+"));

/// How an object is cut and cleaned after the verb.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Shape {
    /// One thing: cut at the first boundary.
    One,
    /// A place: like `One`, but "Portland, Oregon" keeps its region.
    Place,
    /// Possibly a list ("jazz and blues"): one fact per item.
    List,
    /// A preference: cut before what it is preferred to.
    Prefer,
}

/// One verb-led rule: the regex must end right where the object begins.
pub(super) struct Rule {
    pub(super) predicate: &'static str,
    pub(super) confidence: f64,
    pub(super) shape: Shape,
    pub(super) regex: Regex,
}

pub(super) fn rule(predicate: &'static str, confidence: f64, shape: Shape, pattern: &str) -> Rule {
    Rule { predicate, confidence, shape, regex: re(&pattern.replace("{ADV}", ADVERBS)) }
}

/// Rules whose object is cut by [`CUT`] or [`CUT_LIST`]. "I" must stand as a
/// word; "we" is accepted only where a household shares the fact.
pub(super) static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        rule(
            "works_at",
            0.8,
            Shape::One,
            r"(?i)\bI(?:{ADV}\s+(?:work|intern)|(?:'m|\s+am|'ve\s+been|\s+have\s+been){ADV}\s+working)\s+(?:at|for)\s+",
        ),
        rule(
            "lives_in",
            0.8,
            Shape::Place,
            r"(?i)\b(?:I|we)(?:{ADV}\s+(?:live|reside)|(?:'m|\s+am|'re|\s+are|'ve\s+been|\s+have\s+been){ADV}\s+(?:living|based|staying))\s+in\s+",
        ),
        rule("lives_in", 0.7, Shape::Place, r"(?i)\bI(?:'m|\s+am)\s+(?:an?\s+)?(?:[\p{L}-]+\s+){0,3}based\s+in\s+"),
        rule(
            "lives_in",
            0.7,
            Shape::Place,
            r"(?i)\b(?:I|we)(?:'ve|\s+have)?{ADV}\s+(?:moved|relocated)\s+(?:back\s+)?to\s+",
        ),
        rule("from", 0.8, Shape::Place, r"(?i)\bI(?:'m|\s+am)(?:\s+(?:originally|actually|really))?\s+from\s+"),
        rule(
            "from",
            0.7,
            Shape::Place,
            r"(?i)\bI(?:\s+originally)?\s+(?:grew\s+up|was\s+born(?:\s+and\s+raised)?|was\s+raised|come)\s+(?:in|from)\s+",
        ),
        rule(
            "allergic_to",
            0.9,
            Shape::List,
            r"(?i)\bI(?:'m|\s+am){ADV}(?:\s+(?:very|severely|deathly|highly|mildly|super|slightly|extremely))?\s+allergic\s+to\s+",
        ),
        rule(
            "likes",
            0.7,
            Shape::List,
            r"(?i)\bI(?:{ADV}\s+(?:love|like|enjoy|adore)(?:\s+to)?|(?:'m|\s+am){ADV}\s+(?:into|obsessed\s+with|passionate\s+about|an?\s+(?:big|huge|massive)\s+fan\s+of))\s+",
        ),
        rule(
            "likes",
            0.8,
            Shape::One,
            r"(?i)\bmy\s+(?:all[\s-]time\s+)?favou?rite\s+(?:[\p{L}-]+\s+){1,2}(?:is|are|has\s+to\s+be|would\s+be)\s+",
        ),
        rule(
            "dislikes",
            0.7,
            Shape::List,
            r"(?i)\bI(?:{ADV}\s+(?:hate|dislike|detest|loathe|despise|don't\s+like|do\s+not\s+like|don't\s+enjoy|can't\s+stand|cannot\s+stand|can\s+not\s+stand|can't\s+bear)(?:\s+to)?|(?:'m|\s+am){ADV}\s+not\s+(?:a\s+(?:big\s+|huge\s+)?fan\s+of|into))\s+",
        ),
        rule("prefers", 0.7, Shape::Prefer, r"(?i)\bI(?:'d|\s+would)?{ADV}\s+prefer(?:\s+to)?\s+"),
    ]
});

/// "and work at Dell" after "I currently live in Austin": the subject is
/// carried over from the first clause. The verbs have no third-person "-s",
/// so "she lives in Rome and works at Fiat" does not match.
pub(super) static AND_CLAUSE: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i)\band\s+(?:also\s+|now\s+|then\s+|later\s+|just\s+)?(?:(work\s+(?:at|for))|(?:moved|live)\s+(?:to|in))\s+")
});

/// "I have a peanut allergy": the allergen stands before the noun.
pub(super) static ALLERGY_NOUN: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i)\bI(?:\s+have|'ve\s+got|\s+got)\s+(?:an?\s+)?(?:(?:severe|bad|mild|serious|slight|terrible)\s+)?([\p{L}-]+(?:\s+[\p{L}-]+)?)\s+allerg(?:y|ies)\b",
    )
});

pub(super) static NAME_RULES: LazyLock<Vec<(Regex, f64)>> = LazyLock::new(|| {
    vec![
        (re(&format!(r"(?i:\bmy\s+name(?:'s|\s+is))\s+({NAME})")), 0.9),
        (
            re(&format!(
                r"(?i:\b(?:I'm|I\s+am)\s+called|\bI\s+go\s+by|\b(?:please\s+)?call\s+me|\b(?:everyone|people|friends|everybody)\s+calls?\s+me)\s+({NAME})"
            )),
            0.7,
        ),
        (
            re(&format!(
                r"(?i:^\W*(?:hi|hello|hey|hiya|howdy)(?:\s+(?:there|all|everyone|guys))?\W+(?:I'm|I\s+am))\s+({NAME})\b"
            )),
            0.6,
        ),
    ]
});

pub(super) static JOB_RULES: LazyLock<Vec<(Regex, f64)>> = LazyLock::new(|| {
    let job = format!(r"((?:[\p{{L}}-]+\s+){{0,3}}(?:{JOBS}))\b");
    vec![
        (re(&format!(r"(?i)\bI{ADVERBS}\s+work\s+as\s+(?:an?\s+|the\s+)?{job}")), 0.8),
        (re(&format!(r"(?i)\bI(?:'m|\s+am|'ve\s+been|\s+have\s+been){ADVERBS}\s+an?\s+{job}")), 0.8),
    ]
});

pub(super) static PET_VERB: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i)\b(?:I|we)(?:(?:'ve|\s+have){ADV}\s+got|{ADV}\s+(?:have|own|got|adopted|rescued|bought|brought\s+home)|(?:'m|\s+am|'re|\s+are){ADV}\s+fostering)\s+".replace("{ADV}", ADVERBS).as_str())
});

/// An animal noun phrase: optional article or count, up to three modifiers,
/// the animal, then a name given directly or with "named"/"called".
pub(super) static PET_NP: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"^(?i:(?:a|an|the|some|my|our)\s+)?((?i:(?:two|three|four|five|six|seven|eight|nine|ten|\d+)\s+)?(?:[\p{{L}}-]+\s+){{0,3}}?(?i:{ANIMALS}))\b((?:\s+(?i:named|called))?\s+{NAME1}(?:\s+and\s+{NAME1})?)?"
    ))
});

pub(super) static PET_POSSESSIVE: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"(?i:\b(?:my|our)\s+)((?i:(?:two|three|four|five|\d+)\s+)?(?:[\p{{L}}-]+\s+){{0,2}}?(?i:{ANIMALS}))\b((?:\s+(?i:named|called))?\s+{NAME1}(?:\s+and\s+{NAME1})?)?"
    ))
});

/// Between pets in a list: "two cats and a hamster".
pub(super) static PET_JOIN: LazyLock<Regex> = LazyLock::new(|| re(r"^(?:\s*,\s*(?:and\s+)?|\s+and\s+)"));

pub(super) const KIN_MODIFIERS: &str = r"little|baby|youngest|oldest|eldest|older|younger|middle|teenage|adult|grown|grown-up|newborn|twin|step|two|three|four|five|six|\d+-year-old";

pub(super) static CHILD_POSSESSIVE: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"(?i:\b(?:my|our)\s+((?:(?:{KIN_MODIFIERS})\s+){{0,2}})(sons?|daughters?|kids?|children|child|toddlers?|stepsons?|stepdaughters?|twins))\b(?:\s+({NAME1})\b|,\s+({NAME1}),)?"
    ))
});

pub(super) static CHILD_HAVE: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"(?i:\bI{ADVERBS}\s+(?:have|'ve\s+got|have\s+got)\s+(?:(an?)\s+|(two|three|four|five|six|\d+)\s+)(?:(?:little|baby|grown|adult|teenage|young)\s+)?(sons?|daughters?|kids|children|child|twins)\b)(?:\s+(?i:named|called)\s+({NAME1}))?"
    ))
});

pub(super) static SPOUSE: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"(?i:\bmy\s+(?:(?:lovely|dear|wonderful|beloved|amazing|new)\s+)?(wife|husband|spouse|hubby|boyfriend|girlfriend|partner|fianc[ée]e?|fiance|fiancee))\b(?:\s+({NAME1})\b|,\s+({NAME1}),)?"
    ))
});

pub(super) static MARRIED_TO: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"(?i:\bI(?:'m|\s+am|'ve\s+been|\s+have\s+been|\s+got)\s+(?:happily\s+)?married\s+to\s+)(?:({NAME})|(?:[\p{{L}}-]+\s+){{1,4}}?(?i:named|called)\s+({NAME}))"
    ))
});
