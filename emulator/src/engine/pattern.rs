//! mongod-style regular expressions, shared by the query matcher (`$regex`, regex literals)
//! and the expression evaluator (`$regexMatch` and friends).

use std::cell::RefCell;
use std::collections::HashMap;

use regex::Regex;

use super::{EngineError, EngineResult};

thread_local! {
    static REGEX_CACHE: RefCell<HashMap<(String, String), Regex>> = RefCell::new(HashMap::new());
}

/// Compiles a mongod-style regex (options `i m s x`; others are ignored), caching recent
/// patterns because a query compiles the same pattern for every document.
pub(crate) fn compile_regex(pattern: &str, options: &str) -> EngineResult<Regex> {
    let key = (pattern.to_owned(), options.to_owned());
    if let Some(re) = REGEX_CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(re);
    }
    let mut flags = String::new();
    for c in ['i', 'm', 's', 'x'] {
        if options.contains(c) {
            flags.push(c);
        }
    }
    let full = if flags.is_empty() {
        pattern.to_owned()
    } else {
        format!("(?{flags}){pattern}")
    };
    let re = regex::RegexBuilder::new(&full)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| EngineError::bad_value(format!("Regular expression is invalid: {e}")))?;
    REGEX_CACHE.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() >= 256 {
            cache.clear();
        }
        cache.insert(key, re.clone());
    });
    Ok(re)
}
