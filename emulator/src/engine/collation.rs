//! Collation: locale-aware string comparison for queries, sorts, `distinct`, grouping and
//! expression comparisons.
//!
//! mongod compares strings with ICU. The emulator has no ICU; it implements the rules of ICU's
//! root collation that the common options rely on, for Latin script:
//!
//! * primary level: base letters, case and accents ignored; whitespace and punctuation sort
//!   before digits, digits before letters, letters alphabetically, other characters after
//!   them by code point;
//! * secondary level: accents (a letter without one first);
//! * tertiary level: case, lowercase first (`caseFirst: "upper"` reverses it);
//! * `caseLevel: true` compares case right after the primary or secondary level, so strength 1
//!   or 2 can still tell `a` from `A`;
//! * `numericOrdering: true` compares runs of digits by their numeric value;
//! * `alternate: "shifted"` makes whitespace and punctuation ignorable below strength 4;
//! * `backwards: true` compares the secondary level from the end;
//! * strength 4 and 5 break remaining ties by code point.
//!
//! Left out: locale tailorings (every locale sorts by the root rules above), contractions and
//! expansions (`æ`, `ß`, Spanish `ch`), `maxVariable` (only whitespace and punctuation are
//! variable), `normalization` (strings are compared as given), and accents outside Latin-1 and
//! Latin Extended-A.
//!
//! The active collation is a thread-local set by [`with_collation`] around an engine call, so
//! every comparison inside ([`super::compare_bson`]) sees it without threading a parameter
//! through the matcher, sorter and expression evaluator. Index keys (`_id`, unique indexes)
//! always compare with the simple collation: see [`with_simple`].

use std::cell::RefCell;
use std::cmp::Ordering;

use bson::{Bson, Document};

use super::error::{EngineError, EngineResult};

/// A parsed non-simple collation (`locale: "simple"` parses to `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct Collation {
    strength: u8,
    case_level: bool,
    upper_first: bool,
    numeric: bool,
    shifted: bool,
    backwards: bool,
}

thread_local! {
    static ACTIVE: RefCell<Option<Collation>> = const { RefCell::new(None) };
}

/// Runs `f` with `collation` as the active one (`None`: the simple, binary collation), and
/// restores the previous one afterwards, even if `f` unwinds.
pub fn with_collation<R>(collation: Option<&Collation>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Collation>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            ACTIVE.with(|a| *a.borrow_mut() = outer);
        }
    }
    let outer = ACTIVE.with(|a| std::mem::replace(&mut *a.borrow_mut(), collation.cloned()));
    let _restore = Restore(outer);
    f()
}

/// Runs `f` with the simple collation: index keys compare bytewise whatever the command's
/// collation is, as mongod's `_id` index and simple-collation unique indexes do.
pub(crate) fn with_simple<R>(f: impl FnOnce() -> R) -> R {
    if ACTIVE.with(|a| a.borrow().is_none()) {
        return f();
    }
    with_collation(None, f)
}

/// Whether a non-simple collation is active on this thread.
pub(crate) fn is_active() -> bool {
    ACTIVE.with(|a| a.borrow().is_some())
}

/// Compares two strings under the active collation (bytewise when there is none).
pub(crate) fn compare_strings(a: &str, b: &str) -> Ordering {
    ACTIVE.with(|active| match &*active.borrow() {
        Some(c) => c.compare(a, b),
        None => a.cmp(b),
    })
}

/// The fields a collation document may hold, as mongod's `collation` IDL lists them.
const FIELDS: &[&str] = &[
    "locale",
    "caseLevel",
    "caseFirst",
    "strength",
    "numericOrdering",
    "alternate",
    "maxVariable",
    "normalization",
    "backwards",
    "version",
];

fn bool_field(spec: &Document, key: &str) -> EngineResult<bool> {
    match spec.get(key) {
        None => Ok(false),
        Some(Bson::Boolean(b)) => Ok(*b),
        Some(other) => Err(EngineError::type_mismatch(format!(
            "BSON field 'collation.{key}' is the wrong type '{}', expected type 'bool'",
            super::value::bson_type_name(other)
        ))),
    }
}

fn str_field<'a>(spec: &'a Document, key: &str) -> EngineResult<Option<&'a str>> {
    match spec.get(key) {
        None => Ok(None),
        Some(Bson::String(s)) => Ok(Some(s)),
        Some(other) => Err(EngineError::type_mismatch(format!(
            "BSON field 'collation.{key}' is the wrong type '{}', expected type 'string'",
            super::value::bson_type_name(other)
        ))),
    }
}

impl Collation {
    /// Reads a command's `collation` value. `None` for the simple collation.
    pub fn from_bson(value: &Bson) -> EngineResult<Option<Collation>> {
        match value {
            Bson::Document(spec) => Self::parse(spec),
            other => Err(EngineError::type_mismatch(format!(
                "BSON field 'collation' is the wrong type '{}', expected type 'object'",
                super::value::bson_type_name(other)
            ))),
        }
    }

    /// Reads a collation document (mongod's errors for a missing locale, unknown fields and
    /// out-of-range values).
    pub fn parse(spec: &Document) -> EngineResult<Option<Collation>> {
        if let Some(extra) = spec.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(EngineError::location(
                40415,
                format!("BSON field 'collation.{extra}' is an unknown field."),
            ));
        }
        let locale = str_field(spec, "locale")?.ok_or_else(|| {
            EngineError::location(
                40414,
                "BSON field 'collation.locale' is missing but a required field",
            )
        })?;
        if locale == "simple" {
            if spec.len() > 1 {
                return Err(EngineError::bad_value(
                    "If locale=simple, no other fields should be specified",
                ));
            }
            return Ok(None);
        }
        if locale.is_empty() {
            return Err(EngineError::bad_value(
                "Field 'locale' is invalid in: { locale: \"\" }",
            ));
        }
        let strength =
            match spec.get("strength") {
                None => 3,
                Some(v) => match super::value::Num::of(v).map(|n| n.as_f64()) {
                    Some(s) if s.fract() == 0.0 && (1.0..=5.0).contains(&s) => s as u8,
                    Some(s) => {
                        return Err(EngineError::bad_value(format!(
                            "Field 'strength' must be an integer 1 through 5. Got: {s}"
                        )))
                    }
                    None => return Err(EngineError::type_mismatch(
                        "BSON field 'collation.strength' is the wrong type, expected type 'int'",
                    )),
                },
            };
        let upper_first = match str_field(spec, "caseFirst")? {
            None | Some("off") | Some("lower") => false,
            Some("upper") => true,
            Some(other) => {
                return Err(EngineError::bad_value(format!(
                    "Field 'caseFirst' must be 'upper', 'lower', or 'off'. Got: {other}"
                )))
            }
        };
        let shifted = match str_field(spec, "alternate")? {
            None | Some("non-ignorable") => false,
            Some("shifted") => true,
            Some(other) => {
                return Err(EngineError::bad_value(format!(
                    "Field 'alternate' must be 'non-ignorable' or 'shifted'. Got: {other}"
                )))
            }
        };
        match str_field(spec, "maxVariable")? {
            None | Some("punct") | Some("space") => {}
            Some(other) => {
                return Err(EngineError::bad_value(format!(
                    "Field 'maxVariable' must be 'punct' or 'space'. Got: {other}"
                )))
            }
        }
        bool_field(spec, "normalization")?;
        Ok(Some(Collation {
            strength,
            case_level: bool_field(spec, "caseLevel")?,
            upper_first,
            numeric: bool_field(spec, "numericOrdering")?,
            shifted,
            backwards: bool_field(spec, "backwards")?,
        }))
    }

    /// Compares two strings level by level.
    pub fn compare(&self, a: &str, b: &str) -> Ordering {
        let ea = self.elements(a);
        let eb = self.elements(b);
        let primary = |e: &Element| (e.primary, e.number.clone());
        let ord = ea.iter().map(primary).cmp(eb.iter().map(primary));
        if ord != Ordering::Equal {
            return ord;
        }
        if self.strength >= 2 {
            let ord = if self.backwards {
                ea.iter()
                    .rev()
                    .map(|e| e.accent)
                    .cmp(eb.iter().rev().map(|e| e.accent))
            } else {
                ea.iter().map(|e| e.accent).cmp(eb.iter().map(|e| e.accent))
            };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        let case = |e: &Element| e.upper != self.upper_first;
        if self.case_level || self.strength >= 3 {
            let ord = ea.iter().map(case).cmp(eb.iter().map(case));
            if ord != Ordering::Equal {
                return ord;
            }
        }
        if self.strength >= 4 {
            return a.cmp(b);
        }
        Ordering::Equal
    }

    fn elements(&self, s: &str) -> Vec<Element> {
        let mut out = Vec::with_capacity(s.len());
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            if self.numeric && c.is_ascii_digit() {
                // A run of digits is one element, ordered by value: length without leading
                // zeros, then the digits.
                let mut digits = String::from(c);
                while let Some(&d) = chars.peek() {
                    if !d.is_ascii_digit() {
                        break;
                    }
                    digits.push(d);
                    chars.next();
                }
                let trimmed = digits.trim_start_matches('0');
                let value = if trimmed.is_empty() { "0" } else { trimmed };
                out.push(Element {
                    primary: DIGITS,
                    number: Some((value.len(), value.to_owned())),
                    accent: 0,
                    upper: false,
                });
                continue;
            }
            let (base, accent) = fold(c);
            let upper = base.is_uppercase();
            let lower = base.to_lowercase().next().unwrap_or(base);
            let primary = if lower.is_whitespace() {
                VARIABLE + lower as u32
            } else if lower.is_ascii_punctuation() || (!lower.is_alphanumeric() && lower < '\u{80}')
            {
                VARIABLE + 0x100 + lower as u32
            } else if let Some(d) = lower.to_digit(10) {
                DIGITS + d
            } else if lower.is_alphabetic() {
                LETTERS + lower as u32
            } else {
                OTHERS + lower as u32
            };
            if self.shifted && self.strength < 4 && primary < DIGITS {
                // Ignorable at every level compared.
                continue;
            }
            out.push(Element {
                primary,
                number: None,
                accent,
                upper,
            });
        }
        out
    }
}

/// Primary weight bases: whitespace and punctuation (variable), digits, letters, the rest.
const VARIABLE: u32 = 0x100;
const DIGITS: u32 = 0x1000;
const LETTERS: u32 = 0x2000;
const OTHERS: u32 = 0x20_0000;

/// One collation element: a character (or, with numericOrdering, a run of digits).
#[derive(Debug, Clone)]
struct Element {
    primary: u32,
    number: Option<(usize, String)>,
    accent: u8,
    upper: bool,
}

/// Accented Latin letters by base letter; an accent's weight is its position in the string
/// plus one, so every accented form sorts after the bare letter.
const ACCENTED: &[(&str, char)] = &[
    ("àáâãäåāăą", 'a'),
    ("ÀÁÂÃÄÅĀĂĄ", 'A'),
    ("çćĉċč", 'c'),
    ("ÇĆĈĊČ", 'C'),
    ("ďđ", 'd'),
    ("ĎĐ", 'D'),
    ("èéêëēĕėęě", 'e'),
    ("ÈÉÊËĒĔĖĘĚ", 'E'),
    ("ĝğġģ", 'g'),
    ("ĜĞĠĢ", 'G'),
    ("ĥħ", 'h'),
    ("ĤĦ", 'H'),
    ("ìíîïĩīĭįı", 'i'),
    ("ÌÍÎÏĨĪĬĮİ", 'I'),
    ("ĵ", 'j'),
    ("Ĵ", 'J'),
    ("ķ", 'k'),
    ("Ķ", 'K'),
    ("ĺļľŀł", 'l'),
    ("ĹĻĽĿŁ", 'L'),
    ("ñńņňŉ", 'n'),
    ("ÑŃŅŇ", 'N'),
    ("òóôõöøōŏő", 'o'),
    ("ÒÓÔÕÖØŌŎŐ", 'O'),
    ("ŕŗř", 'r'),
    ("ŔŖŘ", 'R'),
    ("śŝşš", 's'),
    ("ŚŜŞŠ", 'S'),
    ("ţťŧ", 't'),
    ("ŢŤŦ", 'T'),
    ("ùúûüũūŭůűų", 'u'),
    ("ÙÚÛÜŨŪŬŮŰŲ", 'U'),
    ("ŵ", 'w'),
    ("Ŵ", 'W'),
    ("ýÿŷ", 'y'),
    ("ÝŸŶ", 'Y'),
    ("źżž", 'z'),
    ("ŹŻŽ", 'Z'),
];

/// A character's base letter and accent weight (0: none).
fn fold(c: char) -> (char, u8) {
    if c.is_ascii() {
        return (c, 0);
    }
    for (forms, base) in ACCENTED {
        if let Some(pos) = forms.chars().position(|f| f == c) {
            return (*base, u8::try_from(pos + 1).unwrap_or(u8::MAX));
        }
    }
    (c, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn coll(spec: Document) -> Collation {
        Collation::parse(&spec).unwrap().unwrap()
    }

    #[test]
    fn strength_two_ignores_case_but_not_accents() {
        let c = coll(doc! {"locale": "en_US", "strength": 2});
        assert_eq!(c.compare("ping", "PING"), Ordering::Equal);
        assert_eq!(c.compare("cafe", "café"), Ordering::Less);
        assert_eq!(c.compare("b", "A"), Ordering::Greater);
    }

    #[test]
    fn strength_one_ignores_accents_and_three_orders_lowercase_first() {
        let one = coll(doc! {"locale": "fr", "strength": 1});
        assert_eq!(one.compare("cafe", "CAFÉ"), Ordering::Equal);
        let three = coll(doc! {"locale": "en"});
        assert_eq!(three.compare("a", "A"), Ordering::Less);
        assert_eq!(three.compare("A", "b"), Ordering::Less);
        let upper = coll(doc! {"locale": "en", "caseFirst": "upper"});
        assert_eq!(upper.compare("a", "A"), Ordering::Greater);
        let case_level = coll(doc! {"locale": "en", "strength": 1, "caseLevel": true});
        assert_eq!(case_level.compare("a", "A"), Ordering::Less);
    }

    #[test]
    fn numeric_ordering_compares_digit_runs_by_value() {
        let c = coll(doc! {"locale": "en", "numericOrdering": true});
        assert_eq!(c.compare("item10", "item9"), Ordering::Greater);
        assert_eq!(c.compare("007", "7"), Ordering::Equal);
        let plain = coll(doc! {"locale": "en"});
        assert_eq!(plain.compare("item10", "item9"), Ordering::Less);
    }

    #[test]
    fn shifted_ignores_punctuation_and_spaces() {
        let c = coll(doc! {"locale": "en", "alternate": "shifted"});
        assert_eq!(c.compare("black-bird", "blackbird"), Ordering::Equal);
        assert_eq!(c.compare("black bird", "blackbird"), Ordering::Equal);
    }

    #[test]
    fn simple_and_bad_specs() {
        assert_eq!(Collation::parse(&doc! {"locale": "simple"}).unwrap(), None);
        assert!(Collation::parse(&doc! {"strength": 2}).is_err());
        assert!(Collation::parse(&doc! {"locale": "en", "strength": 9}).is_err());
        assert!(Collation::parse(&doc! {"locale": "en", "bogus": 1}).is_err());
        assert!(Collation::from_bson(&Bson::Int32(1)).is_err());
    }

    #[test]
    fn the_active_collation_is_scoped() {
        let c = coll(doc! {"locale": "en", "strength": 2});
        assert_eq!(compare_strings("a", "A"), Ordering::Greater);
        with_collation(Some(&c), || {
            assert_eq!(compare_strings("a", "A"), Ordering::Equal);
            with_simple(|| assert_eq!(compare_strings("a", "A"), Ordering::Greater));
            assert_eq!(compare_strings("a", "A"), Ordering::Equal);
        });
        assert_eq!(compare_strings("a", "A"), Ordering::Greater);
    }
}
