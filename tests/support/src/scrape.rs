//! The tests' one reader of Prometheus' text format: a scrape of /metrics
//! parsed into samples, each a name, its labels and its value.

use std::collections::BTreeMap;

/// One sample: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape (comments and blank lines skipped).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses a scrape; panics, naming the line, at one it cannot read.
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| parse_sample(l).unwrap_or_else(|| panic!("not a Prometheus sample: {l:?}")))
            .collect();
        Metrics { samples }
    }

    /// The samples called `name` whose labels include every one of `labels`.
    pub fn matching<'a>(&'a self, name: &'a str, labels: &'a [(&'a str, &'a str)]) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| {
            s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|have| have == v))
        })
    }

    /// The value of the sample called `name` with exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).find(|s| s.labels.len() == labels.len()).map(|s| s.value)
    }

    /// The value of one series written as Prometheus writes it,
    /// `name{label="value",...}` or `name` (labels in any order).
    pub fn series(&self, series: &str) -> Option<f64> {
        let (name, labels) = parse_series(series).unwrap_or_else(|| panic!("not a series: {series:?}"));
        self.samples.iter().find(|s| s.name == name && s.labels == labels).map(|s| s.value)
    }

    /// The sum of the samples [`matching`](Metrics::matching) `name` and `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }
}

/// `name{labels}` into its name and labels.
fn parse_series(series: &str) -> Option<(String, BTreeMap<String, String>)> {
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series.trim().to_string(), BTreeMap::new()));
    };
    let (labels, tail) = parse_labels(rest)?;
    tail.trim().is_empty().then(|| (name.to_string(), labels))
}

/// `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Option<Sample> {
    let (name, labels, rest) = match line.find(['{', ' ']) {
        Some(i) if line.as_bytes()[i] == b'{' => {
            let (labels, rest) = parse_labels(&line[i + 1..])?;
            (&line[..i], labels, rest)
        }
        Some(i) => (&line[..i], BTreeMap::new(), &line[i..]),
        None => return None,
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name: name.to_string(), labels, value })
}

/// The labels after a `{`, up to its `}`; and what follows it.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, rest) = s.split_once('=')?;
        let mut chars = rest.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_string(), value);
        s = &rest[1 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_labels_values_and_escapes() {
        let m = Metrics::parse(
            "# HELP x y\n# TYPE x counter\nup 1\nx{a=\"1\",b=\"q\\\"uo,te}\"} 2.5\nx{a=\"2\"} 3 1700000000\nh_bucket{le=\"+Inf\"} 4\n",
        );
        assert_eq!(m.series("up"), Some(1.0));
        assert_eq!(m.series(r#"x{b="q\"uo,te}",a="1"}"#), Some(2.5));
        assert_eq!(m.value("x", &[("a", "2")]), Some(3.0));
        assert_eq!(m.value("x", &[("a", "1")]), None, "not every label");
        assert_eq!(m.sum("x", &[]), 5.5);
        assert_eq!(m.value("h_bucket", &[("le", "+Inf")]), Some(4.0));
        assert_eq!(m.series("nope"), None);
    }
}
