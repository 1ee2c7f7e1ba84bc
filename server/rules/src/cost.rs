//! `cost: input_tokens + cached_input_tokens / 10 + output_tokens * 6`: a
//! limit that takes its cost from the usage a caller reports (the numbers a
//! paid API answers with), rather than from the request's one `cost`.
//!
//! A formula is a sum of usage fields, each times or divided by a constant,
//! and constants. It is kept as whole numbers over one denominator, so that
//! `30 * 0.1` is exactly 3 (a float would make it 3.0000000000000004 and
//! charge 4). A result with a fraction is rounded up: a call is never
//! charged less than its usage says.

use std::collections::BTreeMap;
use std::fmt;

/// The longest formula, in bytes.
pub const MAX_FORMULA_BYTES: usize = 256;
/// The largest constant a formula may hold; larger ones are refused, so
/// that no sum of usage can overflow.
const MAX_CONSTANT: i128 = 1_000_000;
/// The largest denominator (a formula's divisions and decimals together).
const MAX_DENOMINATOR: i128 = 1_000_000_000;
/// The most usage fields a rule may name (and a call report).
pub const MAX_USAGE_FIELDS: usize = 32;
/// The longest usage field name, in bytes.
pub const MAX_USAGE_NAME_BYTES: usize = 64;

/// Whether `name` is written as a usage field is: lowercase letters,
/// digits and `_`, 1 to [`MAX_USAGE_NAME_BYTES`] bytes. (A rule's `usage`
/// also refuses a leading digit, which a formula could not read.)
pub fn usage_name_form(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_USAGE_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The largest value of one usage field.
pub const MAX_USAGE_VALUE: u64 = u32::MAX as u64;

/// A limit's cost as a formula over usage fields.
#[derive(Clone, PartialEq, Eq)]
pub struct Formula {
    text: String,
    /// Each field's numerator over `denominator`, in name order.
    terms: Vec<(String, i128)>,
    constant: i128,
    denominator: i128,
}

impl fmt::Debug for Formula {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Formula({:?})", self.text)
    }
}

/// Why a formula's value could not be a cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CostError {
    /// The usage made it negative (its value).
    Negative(f64),
    /// It is larger than the largest cost.
    TooLarge(i128),
}

impl Formula {
    /// Reads a formula. The error says what is wrong in one sentence.
    pub fn parse(text: &str) -> Result<Formula, String> {
        if text.len() > MAX_FORMULA_BYTES {
            return Err(format!("is {} bytes long; the limit is {MAX_FORMULA_BYTES}", text.len()));
        }
        let tokens = tokens(text)?;
        let mut p = Parser { tokens: &tokens, at: 0 };
        let sum = p.sum(0)?;
        if p.at != tokens.len() {
            return Err(format!("has '{}' where the formula should end", tokens[p.at]));
        }
        let Linear { terms, constant } = sum;
        let denominator = constant.den;
        let mut lcm = denominator;
        for f in terms.values() {
            lcm = lcm_of(lcm, f.den).ok_or_else(too_precise)?;
        }
        let scale = |f: Fraction| f.num.checked_mul(lcm / f.den).ok_or_else(too_precise);
        let terms: Vec<(String, i128)> = terms
            .into_iter()
            .filter(|(_, f)| f.num != 0)
            .map(|(k, f)| Ok((k, scale(f)?)))
            .collect::<Result<_, String>>()?;
        let constant = scale(constant)?;
        if constant < 0 {
            return Err("is negative when no usage is reported".into());
        }
        if constant == 0 && terms.iter().all(|(_, n)| *n <= 0) {
            return Err("is never above zero: it would charge nothing".into());
        }
        Ok(Formula { text: text.trim().to_string(), terms, constant, denominator: lcm })
    }

    /// The formula as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The usage fields the formula reads, in name order.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|(k, _)| k.as_str())
    }

    /// The cost for this usage (a field not reported is 0), rounded up.
    /// Usage values are at most [`MAX_USAGE_VALUE`].
    pub fn cost(&self, usage: impl Fn(&str) -> u64) -> Result<u64, CostError> {
        let mut total = self.constant;
        for (field, n) in &self.terms {
            let value = i128::from(usage(field).min(MAX_USAGE_VALUE));
            // At most 2^32 * 10^15 per term and 32 terms: far inside i128.
            total += n * value;
        }
        // Negative is refused before rounding: -0.9 is not a cost of 0.
        if total < 0 {
            return Err(CostError::Negative(total as f64 / self.denominator as f64));
        }
        let whole = total.div_euclid(self.denominator) + i128::from(total.rem_euclid(self.denominator) != 0);
        if whole > i128::from(u32::MAX) {
            return Err(CostError::TooLarge(whole));
        }
        Ok(whole as u64)
    }
}

fn too_precise() -> String {
    format!("divides too finely: the divisions and decimals together may divide by at most {MAX_DENOMINATOR}")
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

fn lcm_of(a: i128, b: i128) -> Option<i128> {
    let l = a / gcd(a, b) * b;
    (l <= MAX_DENOMINATOR).then_some(l)
}

/// A rational number, `den` above zero.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Fraction {
    num: i128,
    den: i128,
}

impl Fraction {
    const ZERO: Fraction = Fraction { num: 0, den: 1 };

    fn new(num: i128, den: i128) -> Result<Fraction, String> {
        let g = gcd(num, den).max(1);
        let (num, den) = (num / g, den / g);
        if den > MAX_DENOMINATOR {
            return Err(too_precise());
        }
        if num.abs() > MAX_CONSTANT * den {
            return Err(format!("holds a number above {MAX_CONSTANT}"));
        }
        Ok(Fraction { num, den })
    }

    fn add(self, o: Fraction) -> Result<Fraction, String> {
        let den = lcm_of(self.den, o.den).ok_or_else(too_precise)?;
        Fraction::new(self.num * (den / self.den) + o.num * (den / o.den), den)
    }

    fn mul(self, o: Fraction) -> Result<Fraction, String> {
        let num = self.num.checked_mul(o.num).ok_or_else(too_precise)?;
        let den = self.den.checked_mul(o.den).ok_or_else(too_precise)?;
        Fraction::new(num, den)
    }
}

/// A sum of fields times constants, and a constant.
#[derive(Clone, Debug)]
struct Linear {
    terms: BTreeMap<String, Fraction>,
    constant: Fraction,
}

impl Linear {
    fn constant(c: Fraction) -> Linear {
        Linear { terms: BTreeMap::new(), constant: c }
    }

    fn as_constant(&self) -> Option<Fraction> {
        self.terms.values().all(|f| f.num == 0).then_some(self.constant)
    }

    fn add(mut self, o: Linear, sign: i128) -> Result<Linear, String> {
        for (k, f) in o.terms {
            let f = Fraction { num: f.num * sign, den: f.den };
            let sum = self.terms.get(&k).copied().unwrap_or(Fraction::ZERO).add(f)?;
            self.terms.insert(k, sum);
        }
        self.constant = self.constant.add(Fraction { num: o.constant.num * sign, den: o.constant.den })?;
        Ok(self)
    }

    fn scale(mut self, by: Fraction) -> Result<Linear, String> {
        for f in self.terms.values_mut() {
            *f = f.mul(by)?;
        }
        self.constant = self.constant.mul(by)?;
        Ok(self)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Number(Fraction),
    Field(String),
    Op(char),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Number(n) if n.den == 1 => write!(f, "{}", n.num),
            Token::Number(n) => write!(f, "{}/{}", n.num, n.den),
            Token::Field(name) => f.write_str(name),
            Token::Op(c) => write!(f, "{c}"),
        }
    }
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_ascii_whitespace() {
            chars.next();
        } else if "+-*/()".contains(c) {
            chars.next();
            out.push(Token::Op(c));
        } else if c.is_ascii_digit() {
            let mut end = start;
            while let Some(&(i, d)) = chars.peek() {
                if !(d.is_ascii_digit() || d == '.' || d == '_') {
                    break;
                }
                end = i + d.len_utf8();
                chars.next();
            }
            out.push(Token::Number(number(&text[start..end])?));
        } else if c.is_ascii_lowercase() || c == '_' {
            let mut end = start;
            while let Some(&(i, d)) = chars.peek() {
                if !(d.is_ascii_lowercase() || d.is_ascii_digit() || d == '_') {
                    break;
                }
                end = i + d.len_utf8();
                chars.next();
            }
            out.push(Token::Field(text[start..end].to_string()));
        } else {
            return Err(format!(
                "has '{}', which is not a usage field (lowercase letters, digits, _), a number or one of + - * / ( )",
                c.escape_debug()
            ));
        }
    }
    if out.is_empty() {
        return Err("is empty".into());
    }
    Ok(out)
}

/// `12`, `0.5`, `1_000`: a decimal, exactly.
fn number(s: &str) -> Result<Fraction, String> {
    let digits: String = s.chars().filter(|c| *c != '_').collect();
    let (whole, fraction) = digits.split_once('.').unwrap_or((&digits, ""));
    if whole.is_empty() || fraction.contains('.') || fraction.len() > 9 || whole.len() > 12 {
        return Err(format!("has '{s}', which is not a number this formula can hold (at most 9 decimals)"));
    }
    let den = 10i128.pow(fraction.len() as u32);
    let num: i128 = format!("{whole}{fraction}").parse().map_err(|_| format!("has '{s}', which is not a number"))?;
    Fraction::new(num, den)
}

struct Parser<'t> {
    tokens: &'t [Token],
    at: usize,
}

/// How deep parentheses and signs may nest.
const MAX_DEPTH: usize = 32;

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn sum(&mut self, depth: usize) -> Result<Linear, String> {
        let mut left = self.product(depth)?;
        while let Some(Token::Op(op @ ('+' | '-'))) = self.peek() {
            let sign = if *op == '+' { 1 } else { -1 };
            self.at += 1;
            let right = self.product(depth)?;
            left = left.add(right, sign)?;
        }
        Ok(left)
    }

    fn product(&mut self, depth: usize) -> Result<Linear, String> {
        let mut left = self.factor(depth)?;
        while let Some(Token::Op(op @ ('*' | '/'))) = self.peek() {
            let op = *op;
            self.at += 1;
            let right = self.factor(depth)?;
            left = match op {
                '*' => match (left.as_constant(), right.as_constant()) {
                    (_, Some(c)) => left.scale(c)?,
                    (Some(c), None) => right.scale(c)?,
                    (None, None) => {
                        return Err(
                            "multiplies a usage field by a usage field: a cost grows in step with each field".into()
                        );
                    }
                },
                _ => match right.as_constant() {
                    Some(c) if c.num == 0 => return Err("divides by zero".into()),
                    Some(c) => {
                        left.scale(Fraction::new(c.den, c.num.abs())?.mul(Fraction::new(c.num.signum(), 1)?)?)?
                    }
                    None => return Err("divides by a usage field: only a constant may divide".into()),
                },
            };
        }
        Ok(left)
    }

    fn factor(&mut self, depth: usize) -> Result<Linear, String> {
        if depth > MAX_DEPTH {
            return Err(format!("nests deeper than {MAX_DEPTH}"));
        }
        let Some(token) = self.peek().cloned() else {
            return Err("ends where a number or a usage field should be".into());
        };
        self.at += 1;
        match token {
            Token::Number(n) => Ok(Linear::constant(n)),
            Token::Field(name) => {
                let mut terms = BTreeMap::new();
                terms.insert(name, Fraction { num: 1, den: 1 });
                Ok(Linear { terms, constant: Fraction::ZERO })
            }
            Token::Op('-') => self.factor(depth + 1)?.scale(Fraction { num: -1, den: 1 }),
            Token::Op('+') => self.factor(depth + 1),
            Token::Op('(') => {
                let inner = self.sum(depth + 1)?;
                match self.peek() {
                    Some(Token::Op(')')) => {
                        self.at += 1;
                        Ok(inner)
                    }
                    _ => Err("has a '(' that is not closed".into()),
                }
            }
            other => Err(format!("has '{other}' where a number or a usage field should be")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(text: &str, usage: &[(&str, u64)]) -> Result<u64, CostError> {
        let f = Formula::parse(text).unwrap();
        f.cost(|k| usage.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v))
    }

    #[test]
    fn a_priced_formula_is_exact_and_rounds_up() {
        let text = "input_tokens + cached_input_tokens/10 + output_tokens*6";
        assert_eq!(cost(text, &[("input_tokens", 100), ("cached_input_tokens", 30), ("output_tokens", 5)]), Ok(133));
        // 15 / 10 is 1.5: charged 2, never 1.
        assert_eq!(cost(text, &[("cached_input_tokens", 15)]), Ok(2));
        // A float would read 30 * 0.1 as a little above 3, and charge 4.
        assert_eq!(cost("cached * 0.1", &[("cached", 30)]), Ok(3));
        assert_eq!(cost("2 * (a + b) - b", &[("a", 3), ("b", 4)]), Ok(10));
        assert_eq!(cost("a / 3 / 3", &[("a", 9)]), Ok(1));
        assert_eq!(cost("a / 0.5", &[("a", 9)]), Ok(18));
        assert_eq!(cost("1 + a", &[]), Ok(1));
        let f = Formula::parse("output_tokens*6 + input_tokens").unwrap();
        assert_eq!(f.fields().collect::<Vec<_>>(), ["input_tokens", "output_tokens"]);
    }

    #[test]
    fn usage_that_makes_a_cost_negative_or_too_large_is_an_error() {
        assert_eq!(cost("input - cached", &[("input", 5), ("cached", 7)]), Err(CostError::Negative(-2.0)));
        assert_eq!(
            cost("input - cached + cached / 10", &[("input", 3), ("cached", 4)]),
            Err(CostError::Negative(-0.6))
        );
        assert_eq!(cost("input - cached", &[("input", 7), ("cached", 5)]), Ok(2));
        assert_eq!(cost("a * 2", &[("a", u64::from(u32::MAX))]), Err(CostError::TooLarge(2 * i128::from(u32::MAX))));
        // A value above the largest is read as the largest.
        assert_eq!(cost("a * 1000000", &[("a", u64::MAX)]), Err(CostError::TooLarge(i128::from(u32::MAX) * 1_000_000)));
    }

    #[test]
    fn formulas_that_cannot_be_a_cost_are_refused_with_the_reason() {
        let refused = |text: &str| Formula::parse(text).unwrap_err();
        assert_eq!(refused("a / 0"), "divides by zero");
        assert_eq!(refused("a / (b - b)"), "divides by zero");
        assert_eq!(refused("a / b"), "divides by a usage field: only a constant may divide");
        assert!(refused("a * b").starts_with("multiplies a usage field by a usage field"));
        assert_eq!(refused("a - 5"), "is negative when no usage is reported");
        assert_eq!(refused("-a"), "is never above zero: it would charge nothing");
        assert_eq!(refused("a - a"), "is never above zero: it would charge nothing");
        assert_eq!(refused(""), "is empty");
        assert_eq!(refused("(a + b"), "has a '(' that is not closed");
        assert_eq!(refused("a +"), "ends where a number or a usage field should be");
        assert_eq!(refused("a b"), "has 'b' where the formula should end");
        assert!(refused("Input").starts_with("has 'I', which is not a usage field"));
        assert!(refused("a * 10000000").starts_with("holds a number above"));
        assert!(refused("1.2.3").contains("not a number"));
        assert!(refused(&"(".repeat(40)).starts_with("nests deeper"));
        assert!(refused(&"a+".repeat(200)).contains("bytes long"));
        assert!(refused("a / 7 / 11 / 13 / 17 / 19 / 23 / 29 / 31 / 37").starts_with("divides too finely"));
    }
}
