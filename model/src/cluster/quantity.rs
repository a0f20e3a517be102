//! Kubernetes resource quantities (`10M`, `1Gi`, `500k`, `1e6`), for the bandwidth annotations
//! `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth`.

/// Parses a quantity to an integer, rounding up fractions as `Quantity.Value()` does.
pub fn parse(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a Kubernetes quantity (e.g. 10M, 1Gi, 500k)");
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() || num.starts_with('-') {
        return Err(bad());
    }
    let value: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| bad())?;
            10f64.powi(exp)
        }
        _ => return Err(bad()),
    };
    let v = (value * mult).ceil();
    if !v.is_finite() || v > i64::MAX as f64 {
        return Err(bad());
    }
    Ok(v as i64)
}

/// A bandwidth annotation in bits per second, within what kubelet's shaper accepts
/// (1 kbit/s .. 1 Pbit/s).
pub fn bandwidth(s: &str) -> Result<i64, String> {
    let v = parse(s)?;
    if !(1_000..=1_000_000_000_000_000).contains(&v) {
        return Err(format!("{s:?} is outside 1k..1P bits per second"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse("10M").unwrap(), 10_000_000);
        assert_eq!(parse("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse("500k").unwrap(), 500_000);
        assert_eq!(parse("1e6").unwrap(), 1_000_000);
        assert_eq!(parse("1.5M").unwrap(), 1_500_000);
        assert_eq!(parse("1500m").unwrap(), 2);
        assert_eq!(parse("42").unwrap(), 42);
        for bad in ["", "M", "-1M", "10X", "1.2.3", "1e"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(bandwidth("10").is_err());
        assert!(bandwidth("2P").is_err());
        assert_eq!(bandwidth("100M").unwrap(), 100_000_000);
    }
}
