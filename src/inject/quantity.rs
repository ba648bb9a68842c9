//! Kubernetes resource quantities (`500m`, `0.5`, `128Mi`, `1G`, `1e6`), strictly: the grammar
//! the API server accepts, so a per-pod override the webhook admits is one the pod can carry, and
//! two of them can be compared (a request must not exceed its limit).
//!
//! ```text
//! quantity ::= [+] number suffix
//! number   ::= digits | digits "." digits | digits "." | "." digits
//! suffix   ::= "" | n | u | m | k | M | G | T | P | E      (decimal SI)
//!            | Ki | Mi | Gi | Ti | Pi | Ei                  (binary SI)
//!            | (e | E) [+|-] digits                         (decimal exponent)
//! ```
//! A sign of `-` is refused: no resource is negative.

/// A quantity in nano-units (`1` is 10⁹, `1m` is 10⁶), exact for every suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Quantity(u128);

/// Why a text is not a quantity (the end of a denial message).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum QuantityError {
    #[error("is negative")]
    Negative,
    #[error("is not a Kubernetes quantity (e.g. `500m`, `0.5`, `2` for CPU; `128Mi`, `1G`, `1e9` for memory)")]
    Malformed,
    #[error("is too large")]
    TooLarge,
}

/// Digits after the point beyond this are refused (the API server keeps at most nano precision).
const MAX_FRACTION_DIGITS: usize = 9;
/// Longest text accepted; a real quantity is a handful of characters.
const MAX_LEN: usize = 64;

impl Quantity {
    pub(super) fn parse(text: &str) -> Result<Self, QuantityError> {
        if text.len() > MAX_LEN {
            return Err(QuantityError::Malformed);
        }
        let unsigned = match text.as_bytes().first() {
            Some(b'-') => return Err(QuantityError::Negative),
            Some(b'+') => &text[1..],
            _ => text,
        };
        let number_len = unsigned
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (number, suffix) = unsigned.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty())
            || fraction.contains('.')
            || fraction.len() > MAX_FRACTION_DIGITS
        {
            return Err(QuantityError::Malformed);
        }
        // value = digits × 10^(ten − fraction digits) × 2^two, in nano-units (hence the 9).
        let digits: String = [whole, fraction].concat();
        let mantissa = digits
            .parse::<u128>()
            .map_err(|_| QuantityError::TooLarge)?;
        let (ten, two) = suffix_exponents(suffix)?;
        let mut value = mantissa;
        let mut ten = ten + 9 - fraction.len() as i32;
        while ten > 0 {
            value = value.checked_mul(10).ok_or(QuantityError::TooLarge)?;
            ten -= 1;
        }
        // Finer than a nano-unit: rounded up, as the API server does.
        let mut rounded_away = false;
        while ten < 0 {
            rounded_away |= value % 10 != 0;
            value /= 10;
            ten += 1;
        }
        if rounded_away {
            value += 1;
        }
        value = value
            .checked_mul(1u128 << two)
            .ok_or(QuantityError::TooLarge)?;
        Ok(Self(value))
    }
}

/// The powers of ten and of two a suffix stands for.
fn suffix_exponents(suffix: &str) -> Result<(i32, u32), QuantityError> {
    let decimal = |ten| Ok((ten, 0));
    let binary = |two| Ok((0, two));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .ok_or(QuantityError::Malformed)?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(QuantityError::Malformed);
            }
            let ten: i32 = exponent.parse().map_err(|_| QuantityError::Malformed)?;
            decimal(ten)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nano(text: &str) -> Result<u128, QuantityError> {
        Quantity::parse(text).map(|q| q.0)
    }

    #[test]
    fn the_forms_kubernetes_writes_are_read_exactly() {
        const G: u128 = 1_000_000_000;
        for (text, want) in [
            ("500m", G / 2),
            ("0.5", G / 2),
            (".5", G / 2),
            ("2", 2 * G),
            ("2.", 2 * G),
            ("+1", G),
            ("0", 0),
            ("100u", 100_000),
            ("250n", 250),
            ("128Mi", 128 * (1 << 20) * G),
            ("1Gi", (1 << 30) * G),
            ("1.5Ki", 1536 * G),
            ("1G", G * G),
            ("1k", 1000 * G),
            ("1E", 1_000_000_000_000_000_000 * G),
            ("1e6", 1_000_000 * G),
            ("1E3", 1000 * G),
            ("5e-3", 5_000_000),
            ("12e+0", 12 * G),
        ] {
            assert_eq!(nano(text), Ok(want), "{text}");
        }
        assert_eq!(Quantity::parse("500m"), Quantity::parse("0.5"));
        assert!(Quantity::parse("1Gi").ok() > Quantity::parse("1G").ok());
    }

    #[test]
    fn finer_than_a_nano_unit_rounds_up() {
        assert_eq!(nano("1e-10"), Ok(1));
        assert_eq!(nano("0.1n"), Ok(1));
    }

    #[test]
    fn negatives_garbage_and_overflow_are_refused() {
        assert_eq!(nano("-1"), Err(QuantityError::Negative));
        assert_eq!(nano("-500m"), Err(QuantityError::Negative));
        for bad in [
            "",
            "m",
            "Mi",
            ".",
            "1.2.3",
            "1 Gi",
            " 1",
            "1gi",
            "1mi",
            "1MB",
            "1KiB",
            "1Ki2",
            "1e",
            "1e+",
            "1e1.5",
            "0x10",
            "1,5",
            "500 m",
            "1.0000000001",
            "++1",
            "+-1",
            "lots",
        ] {
            assert_eq!(nano(bad), Err(QuantityError::Malformed), "{bad:?}");
        }
        assert_eq!(nano("1e999"), Err(QuantityError::TooLarge));
        assert_eq!(nano(&"9".repeat(50)), Err(QuantityError::TooLarge));
        assert_eq!(nano(&"1".repeat(100)), Err(QuantityError::Malformed));
    }
}
