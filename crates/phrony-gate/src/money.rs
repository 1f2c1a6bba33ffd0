//! Fixed-point money: amounts are `rust_decimal::Decimal`, never floats.

use std::str::FromStr as _;

use rust_decimal::Decimal;
use serde_json::Value;

/// The most fraction digits an amount may carry.
pub const MAX_SCALE: u32 = 6;

/// Parses an amount given as a JSON number (`50`, `50.5`) or a decimal string (`"50.00"`).
/// The value must be finite, positive or zero, and have at most six fraction digits.
///
/// # Errors
/// A message naming what is wrong with the value.
pub fn parse_amount(value: &Value) -> Result<Decimal, String> {
    let text = match value {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.trim().to_owned(),
        other => {
            return Err(format!(
                "an amount must be a number or a decimal string, got `{other}`"
            ));
        }
    };
    let parsed = Decimal::from_str(&text)
        .or_else(|_| Decimal::from_scientific(&text))
        .map_err(|_| format!("`{text}` is not a decimal amount"))?;
    let parsed = parsed.normalize();
    if parsed.is_sign_negative() && !parsed.is_zero() {
        return Err(format!("an amount must not be negative, got `{text}`"));
    }
    if parsed.scale() > MAX_SCALE {
        return Err(format!(
            "`{text}` has more than {MAX_SCALE} fraction digits"
        ));
    }
    Ok(parsed)
}

/// Renders an amount with at least two fraction digits (`50.00`, `0.125`).
#[must_use]
pub fn display(amount: Decimal) -> String {
    let mut a = amount.normalize();
    if a.scale() < 2 {
        a.rescale(2);
    }
    a.to_string()
}

/// An amount as a JSON number for token claims (`50.0`, `0.125`); evidence only, the
/// decision itself never uses floats.
#[must_use]
pub fn claim_number(amount: Decimal) -> Value {
    let text = amount.normalize().to_string();
    text.parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::String(text), Value::Number)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn amounts_parse_exactly() {
        assert_eq!(parse_amount(&json!(50)).unwrap().to_string(), "50");
        assert_eq!(parse_amount(&json!(50.1)).unwrap().to_string(), "50.1");
        assert_eq!(
            parse_amount(&json!("200.00")).unwrap(),
            Decimal::new(200, 0)
        );
        assert_eq!(parse_amount(&json!(1e-5)).unwrap(), Decimal::new(1, 5));
        assert!(parse_amount(&json!(-1)).is_err());
        assert!(parse_amount(&json!("abc")).is_err());
        assert!(parse_amount(&json!(true)).is_err());
        assert!(parse_amount(&json!("0.0000001")).is_err());
        // 0.1 + 0.2 is exactly 0.3 here.
        let sum = parse_amount(&json!(0.1)).unwrap() + parse_amount(&json!(0.2)).unwrap();
        assert_eq!(sum, parse_amount(&json!("0.3")).unwrap());
    }

    #[test]
    fn display_and_claims() {
        assert_eq!(display(Decimal::new(50, 0)), "50.00");
        assert_eq!(display(Decimal::new(125, 3)), "0.125");
        assert_eq!(claim_number(Decimal::new(50, 0)), json!(50.0));
        assert_eq!(claim_number(Decimal::new(1999, 2)), json!(19.99));
    }
}
